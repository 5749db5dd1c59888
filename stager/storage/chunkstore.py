"""A storage target: a directory of chunk files with fan-out subdirectories.

Everything here is blocking file I/O; the data service calls it through
``asyncio.to_thread``.  Writes are durable before they return.  A chunk that
replaces one is written to a temporary file, ``fsync``'d, renamed into place,
and its directory ``fsync``'d: a crash never tears a chunk that was whole.  A
chunk under a new name (every first write of a file) waits on the disk once, not
twice: its complete temporary file is renamed to its name (no other write of that
name runs meanwhile: they take turns), then the file and the directories that
gained a name are ``fsync``'d together.
A crash before that leaves at most a ``*.tmp`` file (removed at the next start)
or, under the new name, a chunk never acknowledged, whose trailer check fails
when it is not whole (its upload is never committed; it is collected).
"""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..aio import fsync_dir
from ..checksum import crc32c
from ..errors import (
    BadRequest,
    ChecksumMismatch,
    ChunkNotFound,
    InsufficientStorage,
    StagerError,
    StorageError,
    UploadNotFound,
)
from ..protocol.models import parse_chunk_id
from . import chunkfile
from .chunkfile import ChunkMeta

TMP_SUFFIX = ".tmp"
PURGED_FOR = 600.0        # seconds a purged file's chunk writes are refused (and undone)
PURGED_KEPT = 200_000     # at most this many purged file ids remembered
T = TypeVar("T")


@dataclass(frozen=True, order=True)
class StoredChunk:
    """A chunk file as a listing shows it."""

    name: str
    size: int                   # bytes on disk, trailer included
    mtime: int


@dataclass(frozen=True)
class Usage:
    capacity: int
    used: int
    chunks: int
    free: int


class OpenChunk:
    """An open chunk file; use as a context manager."""

    def __init__(self, path: str | Path, name: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkNotFound(f"no chunk {name}", chunk=name) from None
        try:
            self.meta: ChunkMeta = chunkfile.read_meta(self.fd, os.fstat(self.fd).st_size, name)
        except BaseException:
            os.close(self.fd)
            raise
        self.name = name

    def read(self, offset: int, length: int) -> bytes:
        return chunkfile.read_verified(self.fd, self.meta, offset, length, self.name)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> OpenChunk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChunkStore:
    """One target directory.  Thread-safe; every method blocks."""

    def __init__(self, root: str | os.PathLike[str], capacity: int = 0) -> None:
        self.root = Path(root)
        self.chunks_dir = self.root / "chunks"
        self.chunks_dir.mkdir(parents=True, exist_ok=True)
        self._chunks = str(self.chunks_dir)
        self._capacity = capacity
        self._lock = threading.Lock()
        self._turns = threading.Condition(self._lock)
        self._writing: set[str] = set()     # chunks a put_many is writing now
        self._unsynced_dirs: set[Path] = set()  # fan-out directories made, entry not fsynced
        self._used = 0
        self._reserved = 0          # bytes of writes under way, held against the capacity
        self._count = 0
        self._purged: dict[str, float] = {}    # file id -> when purged (monotonic), oldest first
        # the fsyncs of a write, at once: made once, not per write (a thread start each)
        self._pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="chunk-sync")
        self._scan()

    # -- paths ---------------------------------------------------------------
    def _dir_of(self, file_id: str) -> Path:
        return self.chunks_dir / file_id[:2] / file_id[2:4]

    def path_of(self, chunk: str) -> Path:
        return Path(self._path(chunk))

    def _path(self, chunk: str) -> str:
        """:meth:`path_of` as a string: making the Path took longer than the read
        of a small chunk's trailer."""
        file_id, _ = parse_chunk_id(chunk)
        return f"{self._chunks}/{file_id[:2]}/{file_id[2:4]}/{chunk}"

    def _scan(self) -> None:
        """Count what is stored and remove temporary files a crash left behind."""
        used = count = 0
        for dirpath, _, names in os.walk(self.chunks_dir):
            for name in names:
                path = os.path.join(dirpath, name)
                if name.endswith(TMP_SUFFIX):
                    os.unlink(path)
                    continue
                used += os.stat(path).st_size
                count += 1
        self._used, self._count = used, count

    # -- write ---------------------------------------------------------------
    def put(self, chunk: str, data: bytes | memoryview, crc: int) -> ChunkMeta:
        """Store ``data`` as ``chunk`` durably; idempotent for the same bytes.  Returns
        what was stored, as :meth:`put_many` does."""
        return self.put_many([(chunk, data, crc)])[0]

    def put_many(self, items: Sequence[tuple[str, bytes | memoryview, int]]
                 ) -> list[ChunkMeta]:
        """Store many chunks durably, each as :meth:`put` does, waiting on the disk
        for all of them at once; returns, per chunk in order, the size and CRC32C
        read back from the trailer of the file written (what a writer's ack proves).

        Every checksum is checked before anything is written.  Each chunk then
        goes to its temporary file (``SYNC_THREADS`` at a time: the file system's
        journal commits concurrent fsyncs together), fsynced there only where it
        replaces a chunk; all are renamed into place, then the new names' files and
        each directory that gained a name are fsynced at once (the module's
        docstring says why a new name may be renamed first).  A crash leaves
        ``*.tmp`` files or chunks never acknowledged; an error leaves every chunk
        that was whole, whole.
        """
        batch = [_Pending(chunk, memoryview(data), self.path_of(chunk), crc)
                 for chunk, data, crc in items]
        if not batch:
            return []
        if len({p.chunk for p in batch}) != len(batch):
            raise BadRequest("a chunk appears twice in one batch")
        for p in batch:
            p.check()
        self._refuse_purged([p.chunk for p in batch])
        size = sum(p.size for p in batch)
        self._reserve(size)
        self._take_turn(batch)
        try:
            for p in batch:
                p.old = self._existing_size(p.path)
            # the directories whose names change: each chunk's, and the parent of each
            # fan-out directory made now or by a write not done with its fsyncs
            made, synced = self._make_dirs({p.path.parent for p in batch})
            synced |= {p.path.parent for p in batch}
            _each(_Pending.write_temp, batch, self._pool)
            for p in batch:
                p.install()
            # one wait on the disk: the linked files' data and every name, at once
            _each(_sync, [p for p in batch if p.fd is not None] + sorted(synced), self._pool)
            with self._lock:
                self._unsynced_dirs -= made
        except StagerError:
            raise
        except OSError as exc:
            failed = next((p.chunk for p in batch if not p.installed), batch[-1].chunk)
            for p in batch:
                p.close()
                # A new name renamed before its fsync failed (EIO) is no chunk anyone
                # was told of: it goes, as its temporary file would have before.  A
                # replacing chunk was fsynced before its rename, and stays whole.
                if p.installed and p.old is None:
                    _unlink_quietly(p.path)
                    p.installed = False
            raise _storage_error(exc, failed) from exc
        finally:
            for p in batch:
                p.close()
                if p.tmp is not None and not p.installed:
                    _unlink_quietly(p.tmp)
            self._account([p for p in batch if p.installed], reserved=size)
            with self._turns:
                self._writing.difference_update(p.chunk for p in batch)
                self._turns.notify_all()
        self._undo_if_purged([p.chunk for p in batch])
        return [p.stored for p in batch if p.stored is not None]     # (each one is here)

    def _take_turn(self, batch: list[_Pending]) -> None:
        """Wait until no other write of these chunks runs, and hold them: whether a
        name exists stays true until this write installs it (a chunk is renamed
        over another only once fsynced; see the module's docstring)."""
        names = {p.chunk for p in batch}
        with self._turns:
            while not names.isdisjoint(self._writing):
                self._turns.wait()
            self._writing |= names

    def _make_dirs(self, directories: set[Path]) -> tuple[set[Path], set[Path]]:
        """Make the fan-out directories missing among ``directories`` (one mkdir where
        the leaf is there); returns those made, and the directories to fsync for
        them: the parent of each one made, or made by a write not done with its
        fsyncs, which a chunk acknowledged first would hang on.  Each mkdir and its
        mark are one step under the lock, so no write finds a directory unmarked
        before it is durable."""
        made: set[Path] = set()

        def mkdir(d: Path) -> None:
            try:
                os.mkdir(d)
            except FileExistsError:
                return
            made.add(d)
            self._unsynced_dirs.add(d)

        with self._lock:
            for directory in sorted(directories):
                try:
                    mkdir(directory)
                except FileNotFoundError:
                    mkdir(directory.parent)
                    mkdir(directory)
            pending = {d for d in (*directories, *(d.parent for d in directories))
                       if d in self._unsynced_dirs}
        return made, {d.parent for d in pending}

    def _reserve(self, size: int) -> None:
        """Hold ``size`` bytes of the capacity for a write, or refuse it as full.  The
        check and the hold are one step under the lock: checked apart, concurrent
        writes each saw the room the others were about to fill, and together went
        past the limit (CI: 48 chunks of 64 KiB on a target of 48 × 64 KiB, trailers
        beyond it)."""
        with self._lock:
            taken = self._used + self._reserved
            if self._capacity and taken + size > self._capacity:
                raise InsufficientStorage(f"target full: {taken} of {self._capacity} bytes used",
                                          capacity=self._capacity, used=taken)
            self._reserved += size

    def _account(self, installed: list[_Pending], reserved: int) -> None:
        """Count the chunks a write installed, and release what it held."""
        with self._lock:
            self._reserved -= reserved
            for p in installed:
                self._used += p.size - (p.old or 0)
                self._count += 0 if p.old is not None else 1

    @staticmethod
    def _existing_size(path: Path) -> int | None:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return None

    # -- read ----------------------------------------------------------------
    def open(self, chunk: str) -> OpenChunk:
        return OpenChunk(self._path(chunk), chunk)

    def read(self, chunk: str, offset: int, length: int) -> bytes:
        with self.open(chunk) as oc:
            return oc.read(offset, length)

    def verify(self, chunk: str) -> ChunkMeta:
        with self.open(chunk) as oc:
            chunkfile.verify_all(oc.fd, oc.meta, chunk)
            return oc.meta

    # -- delete --------------------------------------------------------------
    def delete(self, chunk: str) -> bool:
        path = self.path_of(chunk)
        try:
            size = path.stat().st_size
            os.unlink(path)
        except FileNotFoundError:
            return False        # not there, or a concurrent delete took it first
        with self._lock:
            self._used -= size
            self._count -= 1
        return True

    def purge(self, file_id: str) -> int:
        """Delete every chunk of ``file_id``; returns how many were removed.  For
        :data:`PURGED_FOR` seconds after, writes of its chunks are refused."""
        now = time.monotonic()
        with self._lock:            # marked before listing: see _undo_if_purged
            self._purged.pop(file_id, None)
            self._purged[file_id] = now
            while True:                         # forget the oldest marks
                old, when = next(iter(self._purged.items()))
                if when > now - PURGED_FOR and len(self._purged) <= PURGED_KEPT:
                    break
                del self._purged[old]
        directory = self._dir_of(file_id)
        removed = 0
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0
        prefix = file_id + "."
        for name in names:
            if name.startswith(prefix) and self.delete(name):
                removed += 1
        return removed

    def _purged_of(self, chunks: Sequence[str]) -> list[str]:
        with self._lock:
            return [c for c in chunks if parse_chunk_id(c)[0] in self._purged]

    def _refuse_purged(self, chunks: Sequence[str]) -> None:
        gone = self._purged_of(chunks)
        if gone:
            file_id, _ = parse_chunk_id(gone[0])
            raise UploadNotFound(f"file {file_id} was collected: its chunks are not taken",
                                 file_id=file_id, chunk=gone[0])

    def _undo_if_purged(self, chunks: Sequence[str]) -> None:
        """Remove chunks whose file was purged while they were being written, and
        refuse them.  A writer that gave up (its file aborted and collected) can
        still have a chunk on its way here; landing after the purge, it would stay
        an orphan until fsck.  The purge marks its file before it lists the
        directory, and a write checks after it installed its file: so either the
        purge saw the chunk, or the write sees the mark."""
        gone = self._purged_of(chunks)
        for chunk in gone:
            self.delete(chunk)
        self._refuse_purged(gone)

    def list_chunks(self) -> list[str]:
        return sorted(f.name for top in self.top_dirs() for f in self.scan(top))

    def top_dirs(self) -> list[Path]:
        """The first level of fan-out directories: :meth:`scan` one at a time to walk
        every chunk without holding all of them."""
        try:
            return sorted(p for p in self.chunks_dir.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def scan(self, top: Path) -> list[StoredChunk]:
        """Every chunk file below ``top`` (temporary files skipped), by name."""
        out = []
        for dirpath, _, names in os.walk(top):
            for name in names:
                if name.startswith(".") or name.endswith(TMP_SUFFIX):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue        # deleted while we looked
                out.append(StoredChunk(name, st.st_size, int(st.st_mtime)))
        out.sort()
        return out

    # -- space ---------------------------------------------------------------
    def usage(self) -> Usage:
        st = os.statvfs(self.chunks_dir)
        fs_total = st.f_blocks * st.f_frsize
        fs_free = st.f_bavail * st.f_frsize
        capacity = self._capacity or fs_total
        taken = self._used + self._reserved
        free = min(fs_free, capacity - taken) if self._capacity else fs_free
        return Usage(capacity=capacity, used=self._used, chunks=self._count, free=max(free, 0))


SYNC_THREADS = 16          # temporary files written and fsynced at once by put_many


class _Pending:
    """One chunk of :meth:`ChunkStore.put_many` on its way to the disk."""

    def __init__(self, chunk: str, data: memoryview, path: Path, crc: int) -> None:
        self.chunk, self.data, self.path, self.crc = chunk, data, path, crc
        self.trailer = b""
        self.stored: ChunkMeta | None = None     # read back from the file written
        self.old: int | None = None
        self.tmp: Path | None = None
        self.fd: int | None = None      # held open until fsynced (a chunk under a new name)
        self.installed = False

    @property
    def size(self) -> int:
        return len(self.data) + len(self.trailer)

    def check(self) -> None:
        actual = crc32c(self.data)
        if actual != self.crc:
            raise ChecksumMismatch(
                f"chunk {self.chunk}: body CRC32C {actual:08x} != declared {self.crc:08x}",
                chunk=self.chunk, expected=f"{self.crc:08x}", actual=f"{actual:08x}")
        self.trailer = chunkfile.build_trailer(self.data, actual)

    def write_temp(self) -> None:
        """Write the chunk to a temporary file: fsynced now where it will replace a
        chunk, else kept open to be fsynced with the directory (:meth:`install`)."""
        tmp = self.path.with_name(f".{self.chunk}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise _storage_error(exc, self.chunk) from exc
        self.tmp, self.fd = tmp, fd
        try:
            _write_all(fd, self.data)
            _write_all(fd, self.trailer)
            if self.old is not None:
                os.fsync(fd)
            # The ack names what the file holds, not what was asked: its trailer,
            # read back and checked (length and the trailer's own CRC).
            self.stored = chunkfile.read_meta(fd, os.fstat(fd).st_size, self.chunk)
        except OSError as exc:
            raise _storage_error(exc, self.chunk) from exc
        finally:
            if self.old is not None:
                self.close()

    def install(self) -> None:
        """Put the written file under the chunk's name."""
        os.replace(self.tmp, self.path)     # type: ignore[arg-type]
        self.installed = True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _each(fn: Callable[[T], object], items: Sequence[T], pool: ThreadPoolExecutor) -> None:
    """``fn(item)`` for every item, the first here and the others on ``pool``; the
    first error is raised once all have finished (none is left running)."""
    futures = [pool.submit(fn, item) for item in items[1:]]
    try:
        if items:
            fn(items[0])
    finally:
        wait(futures)
    for future in futures:
        future.result()


def _sync(what: _Pending | Path) -> None:
    """fsync a chunk file held open, or a directory.  fsync, not fdatasync: every file
    synced here is new (a new name's, or a temporary file), and a new file's
    fdatasync commits the same journal transaction as its fsync (its inode, size and
    blocks are what reading it back needs; ext4, XFS), so it would save nothing."""
    if isinstance(what, _Pending):
        assert what.fd is not None
        os.fsync(what.fd)
    else:
        fsync_dir(what)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _storage_error(exc: OSError, chunk: str) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(f"target full while writing chunk {chunk}", chunk=chunk)
    return StorageError(f"I/O error writing chunk {chunk}: {exc.strerror}", chunk=chunk)
