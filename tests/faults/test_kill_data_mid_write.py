"""kill -9 the data server in the middle of chunk writes: nothing torn ever looks whole.

A new chunk is written to a temporary file, renamed to its name, then fsynced
with its directory before the ack (stager/storage/chunkstore.py: one wait on the
disk, issue 30).  Killed mid-write, the server leaves temporary files (removed at
its next start) or chunks never acknowledged; every chunk file under its name must
pass its trailer and CRC checks, and every acknowledged file must read back.  Where
the kill cut the disk short instead (a power cut after the rename, before the
fsync), only a prefix of the file or zeros may have reached the disk: the trailer
and the block CRCs refuse every such file, which the second test shows byte by byte.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_util import verify_copy

from faults.faultlib import make_bytes, read_back
from stager import AsyncClient
from stager.checksum import crc32c
from stager.config import load_config
from stager.errors import CorruptChunk
from stager.protocol.models import LayoutSpec
from stager.storage import ChunkStore
from stager.storage.chunkstore import TMP_SUFFIX
from stager.testing import ProcessCluster
from stager.testing.cluster import wait_for_targets

pytestmark = pytest.mark.faults
WRITERS = 6
SIZES = (1024, 96 * 1024, 1536 * 1024)     # one block, two blocks, many (chunks of 1 MiB)


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").rglob("*") if p.is_file())


async def _writer(c: AsyncClient, w: int, stop: asyncio.Event,
                  acked: dict[str, bytes]) -> None:
    i = 0
    while not stop.is_set():
        path = f"/mid/w{w}/f{i:04d}"
        body = make_bytes(path, SIZES[i % len(SIZES)])
        i += 1
        try:
            await c.pipe(path, body, layout=LayoutSpec(chunk_size=1024 * 1024))
        except Exception:       # the server died under it: never acknowledged
            continue
        acked[path] = body


async def _stop_mid_write(pid: int, root: Path, acked: dict[str, bytes]) -> list[Path]:
    """Stop the server (SIGSTOP) once writes flow, preferably the moment a temporary
    file is on disk (a chunk half on its way), and leave it stopped; returns those
    temporary files (none: not caught within a few seconds, stopped anyway)."""
    deadline = time.monotonic() + 5
    while len(acked) < 10 or time.monotonic() < deadline:
        await asyncio.sleep(0.005)
        if len(acked) < 10:
            continue
        os.kill(pid, signal.SIGSTOP)
        in_flight = [p for p in _chunk_files(root) if p.name.endswith(TMP_SUFFIX)]
        if in_flight or time.monotonic() >= deadline:
            return in_flight
        os.kill(pid, signal.SIGCONT)
    raise AssertionError("unreachable")


async def test_a_data_server_killed_mid_write_leaves_no_whole_looking_torn_chunk(
        tmp_path: Path, figures: dict[str, Any]) -> None:
    acked: dict[str, bytes] = {}
    stop = asyncio.Event()
    with ProcessCluster(tmp_path, 1, restart=True) as cluster:
        root = cluster.data_root(0)
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            writers = [asyncio.create_task(_writer(c, w, stop, acked)) for w in range(WRITERS)]
            pid = cluster.data_pid(0)
            try:
                in_flight = await _stop_mid_write(pid, root, acked)
                os.kill(pid, signal.SIGKILL)
                # At once, before its restart and before any collection: what the kill
                # left under a chunk's name is whole (the temporary files may not be).
                named = [p for p in _chunk_files(root) if not p.name.endswith(TMP_SUFFIX)]
                for p in named:
                    verify_copy(p)   # its trailer, every block, the whole-chunk CRC
            finally:
                stop.set()
                await asyncio.gather(*writers)
            figures.update(temporary_files_at_the_kill=len(in_flight), chunk_files=len(named),
                           acknowledged=len(acked))
        await asyncio.to_thread(cluster.wait_restarted, "data", 0, pid)
        await asyncio.to_thread(wait_for_targets, cluster.meta_url, 1)
        files = _chunk_files(root)
        assert not [p for p in files if p.name.endswith(TMP_SUFFIX)]   # removed at start
        for p in files:
            verify_copy(p)   # its trailer, every block, the whole-chunk CRC
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            nbytes, bad = await read_back(c, acked)
    assert bad == [], bad[:5]
    assert nbytes == sum(len(b) for b in acked.values()) and len(acked) >= 10


@pytest.mark.parametrize("size", [1024, 70 * 1024])
def test_a_chunk_cut_short_or_zeroed_by_a_power_cut_is_refused(tmp_path: Path,
                                                               size: int) -> None:
    """What a power cut between the rename and the fsync may leave under the name: a
    prefix of the file (any length), or its full length with zeros where the data had
    not reached the disk.  None opens as a chunk, or none verifies."""
    store = ChunkStore(tmp_path / "t")
    data = os.urandom(size)
    chunk = "ab" * 16 + ".0"
    store.put(chunk, data, crc32c(data))
    path = store.path_of(chunk)
    whole = path.read_bytes()
    step = 1 if size <= 4096 else 509
    for cut in [*range(0, len(whole), step), len(whole) - 1]:
        path.write_bytes(whole[:cut])
        with pytest.raises(CorruptChunk):
            store.open(chunk).close()
    for start in range(0, size, 4096):          # a page of data never written: zeros
        torn = bytearray(whole)
        torn[start:min(start + 4096, size)] = bytes(min(4096, size - start))
        if torn == whole:
            continue
        path.write_bytes(bytes(torn))
        with pytest.raises(CorruptChunk):
            store.verify(chunk)
        with store.open(chunk) as oc:
            with pytest.raises(CorruptChunk):
                oc.read(start, 1)
