"""Which fsyncs a chunk write waits on, and in which order (issue 30: a 1 KiB durable
file near its floor).  The fsyncs are the real system calls, watched on their way
through: each names the file or directory it made durable."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager.checksum import crc32c
from stager.storage import ChunkStore, chunkstore

DATA = b"x" * 1024


@pytest.fixture
def store(tmp_path: Path) -> ChunkStore:
    return ChunkStore(tmp_path / "target")


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every fsync and rename, in order: ("fsync", what it names) or ("rename", to)."""
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    fsync, replace = os.fsync, os.replace

    def watched_fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        fsync(fd)
        with lock:
            seen.append(("fsync", name))

    def watched_replace(src: str, dst: str) -> None:
        replace(src, dst)
        with lock:
            seen.append(("rename", str(dst)))

    monkeypatch.setattr(chunkstore.os, "fsync", watched_fsync)
    monkeypatch.setattr(chunkstore.os, "replace", watched_replace)
    # fsync_dir lives in stager.aio and uses the same os module
    yield seen


def _fsynced(seen: list[tuple[str, str]]) -> set[str]:
    return {what for op, what in seen if op == "fsync"}


def test_a_new_chunk_in_a_new_fan_out_directory(store: ChunkStore,
                                                synced: list[tuple[str, str]]) -> None:
    """The file, its directory and the directory that gained the new fan-out
    directory: nothing more (the chunks directory only when a top one was made)."""
    chunk = f"{uuid.uuid4().hex}.0"
    store.put(chunk, DATA, crc32c(DATA))
    leaf = store.path_of(chunk).parent
    assert _fsynced(synced) == {str(store.path_of(chunk)), str(leaf), str(leaf.parent),
                                str(store.chunks_dir)}
    assert len(synced) == 5         # four fsyncs and the rename, each once


def test_a_new_chunk_beside_others_waits_on_its_file_and_directory(
        store: ChunkStore, synced: list[tuple[str, str]]) -> None:
    file_id = uuid.uuid4().hex
    store.put(f"{file_id}.0", DATA, crc32c(DATA))
    synced.clear()
    chunk = f"{file_id}.1"
    store.put(chunk, DATA, crc32c(DATA))
    path = store.path_of(chunk)
    assert _fsynced(synced) == {str(path), str(path.parent)}
    # the new name's file is fsynced after its rename, together with the directory
    assert [op for op, _ in synced][0] == "rename"


def test_a_chunk_that_replaces_one_is_fsynced_before_its_rename(
        store: ChunkStore, synced: list[tuple[str, str]]) -> None:
    """Renamed over a whole chunk unsynced, a crash could tear it: not so."""
    chunk = f"{uuid.uuid4().hex}.0"
    store.put(chunk, DATA, crc32c(DATA))
    synced.clear()
    store.put(chunk, DATA, crc32c(DATA))
    path = store.path_of(chunk)
    ops = [op for op, _ in synced]
    assert ops == ["fsync", "rename", "fsync"]
    assert synced[1] == ("rename", str(path)) and synced[2] == ("fsync", str(path.parent))
    assert store.read(chunk, 0, len(DATA)) == DATA


def test_a_batch_of_new_chunks_waits_on_every_file(store: ChunkStore,
                                                   synced: list[tuple[str, str]]) -> None:
    chunks = [f"{uuid.uuid4().hex}.0" for _ in range(5)]
    stored = store.put_many([(c, DATA, crc32c(DATA)) for c in chunks])
    assert [s.data_len for s in stored] == [len(DATA)] * 5
    fsynced = _fsynced(synced)
    assert {str(store.path_of(c)) for c in chunks} <= fsynced
    assert {str(store.path_of(c).parent) for c in chunks} <= fsynced
    assert not [p for p in store.chunks_dir.rglob("*.tmp")]


def test_writes_of_one_chunk_take_turns(store: ChunkStore,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second write of a chunk waits while the first runs: the name the first saw
    absent stays absent until it installed its file."""
    chunk = f"{uuid.uuid4().hex}.0"
    inside, go = threading.Event(), threading.Event()
    write_temp = chunkstore._Pending.write_temp

    def slow(self: chunkstore._Pending) -> None:
        if not inside.is_set():
            inside.set()
            assert go.wait(10)
        write_temp(self)

    monkeypatch.setattr(chunkstore._Pending, "write_temp", slow)
    first = threading.Thread(target=store.put, args=(chunk, DATA, crc32c(DATA)))
    first.start()
    assert inside.wait(10)
    second_done = threading.Event()
    second = threading.Thread(target=lambda: (store.put(chunk, DATA, crc32c(DATA)),
                                              second_done.set()))
    second.start()
    assert not second_done.wait(0.3)    # its turn comes after the first's
    go.set()
    first.join(10)
    second.join(10)
    assert second_done.is_set()
    assert store.read(chunk, 0, len(DATA)) == DATA
    assert store.usage().chunks == 1


def test_a_chunk_in_a_directory_another_write_just_made_waits_for_its_name(
        store: ChunkStore, synced: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The write that made a fan-out directory fsyncs its parent; a second write
    into it, acknowledged first, must not hang on a name not yet durable: it fsyncs
    that parent too.  Once the first is done, later writes there need not."""
    file_id = uuid.uuid4().hex
    inside, go = threading.Event(), threading.Event()
    write_temp = chunkstore._Pending.write_temp

    def slow(self: chunkstore._Pending) -> None:
        if self.chunk.endswith(".0"):
            inside.set()
            assert go.wait(10)
        write_temp(self)

    monkeypatch.setattr(chunkstore._Pending, "write_temp", slow)
    first = threading.Thread(target=store.put, args=(f"{file_id}.0", DATA, crc32c(DATA)))
    first.start()
    assert inside.wait(10)
    synced.clear()
    store.put(f"{file_id}.1", DATA, crc32c(DATA))      # while the first still writes
    leaf = store.path_of(f"{file_id}.1").parent
    assert {str(leaf), str(leaf.parent), str(store.chunks_dir)} <= _fsynced(synced)
    go.set()
    first.join(10)
    synced.clear()
    store.put(f"{file_id}.2", DATA, crc32c(DATA))
    assert _fsynced(synced) == {str(store.path_of(f"{file_id}.2")), str(leaf)}
