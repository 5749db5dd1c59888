"""Sealed files: the chunks of a completed multipart object, fenced against late writes.

A multipart part is written straight into the final file's chunk slots, and a part of
another client (placed from its slot cache, or begun before the completion) can still
be on its way when the upload completes.  Refusing its record is too late: its bytes
would already sit in the object's chunks.  So completing seals the object here first
(``POST /v1/seal``, from the metadata server): each of its chunks on this target with the
CRC32C the object was committed with, and its chunk count.  From then on a write of a
chunk of that file is refused (``upload_not_found``, as for a purged file) unless it
brings those very bytes (a repair, a retried write whose answer was lost) and lies
within the object.  The check and the seal both run on the event loop, and a seal waits
for the writes of its file checked before it: so a write either was refused, or was
stored before the seal answers, and the seal reads the stored CRCs back and names the
chunks that differ (the completion then refuses to commit what it did not write).

Seals are kept on disk (``ROOT/seals/FILE_ID``, written durably before the seal
answers) so that a restarted target keeps them, for :data:`SEAL_KEEP` seconds: far
longer than a capability lives (600 s) or a slot is placed from a cache (60 s), so
longer than any write of a part can be under way.  Purging a file drops its seal.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from array import array
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..aio import fsync_dir
from ..errors import UploadNotFound
from ..protocol.models import check_file_id, parse_chunk_id

SEAL_KEEP = 86400.0         # seconds a seal is kept
SEALS_KEPT = 1_000_000      # at most this many sealed files remembered


@dataclass(frozen=True)
class Seal:
    """The chunks of a file held here, with the CRC32C each must keep, and its count.
    Two arrays, indices ascending (8 bytes a chunk: a day of seals stays small)."""

    count: int
    indices: array[int]
    crcs: array[int]
    when: float             # wall clock: kept across restarts

    @classmethod
    def of(cls, count: int, crcs: dict[int, int], when: float) -> Seal:
        held = sorted(crcs.items())
        return cls(count, array("I", (i for i, _ in held)), array("I", (c for _, c in held)),
                   when)

    def refuses(self, index: int, crc: int) -> bool:
        if index >= self.count:
            return True
        at = bisect_left(self.indices, index)
        return at < len(self.indices) and self.indices[at] == index and self.crcs[at] != crc

    def to_json(self) -> dict[str, object]:
        return {"count": self.count, "crcs": list(zip(self.indices, self.crcs, strict=True)),
                "when": self.when}


class Seals:
    """The sealed files of one target, in memory and under ``root/seals``."""

    def __init__(self, root: Path, keep: float = SEAL_KEEP) -> None:
        self.dir = root / "seals"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._sealed: OrderedDict[str, Seal] = OrderedDict()    # oldest first
        self._writing: Counter[str] = Counter()     # file id -> its chunk writes under way
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._load()

    def _load(self) -> None:
        old = time.time() - self.keep
        found = []
        for path in self.dir.iterdir():
            try:
                check_file_id(path.name)
                obj = json.loads(path.read_bytes())
                seal = Seal.of(int(obj["count"]), {int(i): int(c) for i, c in obj["crcs"]},
                               float(obj["when"]))
            except (ValueError, KeyError, TypeError, OSError):
                path.unlink(missing_ok=True)        # a torn temporary file, or not ours
                continue
            if seal.when < old:
                path.unlink(missing_ok=True)
            else:
                found.append((seal.when, path.name, seal))
        for _, file_id, seal in sorted(found):
            self._sealed[file_id] = seal

    # -- the write path (on the loop) ------------------------------------------
    def check(self, chunks: Sequence[tuple[str, int]]) -> None:
        """Refuse a write of (chunk, crc) pairs if one is of a sealed file and is not
        that chunk's own bytes."""
        if not self._sealed:
            return
        for chunk, crc in chunks:
            file_id, index = parse_chunk_id(chunk)
            seal = self._sealed.get(file_id)
            if seal is not None and seal.refuses(index, crc):
                raise UploadNotFound(f"file {file_id} is a completed object: its chunk "
                                     f"{index} keeps its bytes", file_id=file_id, chunk=chunk)

    @contextmanager
    def writing(self, chunks: Sequence[str]) -> Iterator[None]:
        """Count the writes of these chunks' files while they are under way."""
        files = {chunk.partition(".")[0] for chunk in chunks}
        self._writing.update(files)
        try:
            yield
        finally:
            self._writing.subtract(files)
            for file_id in files:
                if self._writing[file_id] <= 0:
                    del self._writing[file_id]
                    for waiter in self._waiting.pop(file_id, []):
                        if not waiter.done():
                            waiter.set_result(None)

    # -- sealing ---------------------------------------------------------------
    async def seal(self, file_id: str, count: int, crcs: dict[int, int]
                   ) -> tuple[Seal, list[str]]:
        """Seal ``file_id`` now; return once every write checked before is done, with
        the seal and the old seals forgotten: :meth:`store` them (blocking)."""
        seal = Seal.of(count, crcs, time.time())
        self._sealed.pop(file_id, None)
        self._sealed[file_id] = seal
        while self._writing.get(file_id):
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(file_id, []).append(waiter)
            await waiter
        return seal, self._forget_old()

    def release(self, file_ids: Sequence[str]) -> list[str]:
        """Lift the seals of ``file_ids`` (a completion that did not commit, a purge);
        returns those whose file on disk is to be removed (:meth:`remove`)."""
        return [f for f in file_ids if self._sealed.pop(f, None) is not None]

    def remove(self, file_ids: Sequence[str]) -> None:
        """Remove seals' files (blocking)."""
        for file_id in file_ids:
            (self.dir / file_id).unlink(missing_ok=True)
        if file_ids:
            fsync_dir(self.dir)

    def _forget_old(self) -> list[str]:
        old = time.time() - self.keep
        gone = []
        while self._sealed:
            file_id, seal = next(iter(self._sealed.items()))
            if seal.when >= old and len(self._sealed) <= SEALS_KEPT:
                break
            del self._sealed[file_id]
            gone.append(file_id)
        return gone

    def store(self, file_id: str, seal: Seal, forgotten: list[str]) -> None:
        """Keep ``seal`` on disk (durably), and remove the ``forgotten`` ones'."""
        body = json.dumps(seal.to_json()).encode()
        path = self.dir / file_id
        tmp = path.with_name(f".{file_id}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        for old in forgotten:
            (self.dir / old).unlink(missing_ok=True)
        fsync_dir(self.dir)
