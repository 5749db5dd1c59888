"""The data service: a chunk store behind asyncio.  Knows nothing of HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config
from ..errors import BadRequest, StagerError
from ..protocol.models import TARGET_ID_RE, ReadItem, check_file_id, chunk_id
from ..storage import ChunkMeta, ChunkStore, OpenChunk, Usage
from .batchread import BatchRead
from .credential import TargetCredential
from .seals import Seals

if TYPE_CHECKING:
    from .scrub import Scrubber

MAX_BATCH_ITEMS = 65536


@dataclass(frozen=True)
class Identity:
    target_id: str
    node: str


def load_identity(root: Path, config: Config) -> Identity:
    """The target's stable id and node, kept in ``root/target.json`` across restarts."""
    path = root / "target.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    target_id = config.target_id or stored.get("target_id") or "t-" + uuid.uuid4().hex[:12]
    node = config.node or stored.get("node") or socket.gethostname()
    if not TARGET_ID_RE.match(target_id):
        raise BadRequest(f"invalid target id {target_id!r}")
    if stored != {"target_id": target_id, "node": node}:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"target_id": target_id, "node": node}))
        os.replace(tmp, path)
    return Identity(target_id, node)


class DataService:
    def __init__(self, config: Config) -> None:
        root = Path(config.root)
        self.config = config
        self.identity = load_identity(root, config)
        self.credential = TargetCredential(root, config)    # what it speaks to the meta with
        self.store = ChunkStore(root, capacity=config.capacity)
        self.seals = Seals(root)        # completed multipart objects' chunks (seals.py)
        # Chunk bytes served and stored since start: heartbeats carry them, and the
        # metadata server shows their rates (stager/meta/targetstats.py).
        self.bytes_read = 0
        self.bytes_written = 0
        self.scrubber: Scrubber | None = None      # set by stager/data/maintenance.py

    async def put(self, chunk: str, data: bytes | bytearray | memoryview, crc: int
                  ) -> ChunkMeta:
        return (await self.put_many([(chunk, memoryview(data), crc)]))[0]

    async def put_many(self, items: Sequence[tuple[str, memoryview, int]]) -> list[ChunkMeta]:
        """Many chunks, each durable before this returns; per chunk, its size and
        CRC32C read back from the file written (see ChunkStore.put_many).  A chunk of
        a sealed file with other bytes than its own is refused (seals.py)."""
        self.seals.check([(chunk, crc) for chunk, _, crc in items])
        with self.seals.writing([chunk for chunk, _, _ in items]):
            return await asyncio.to_thread(self.store.put_many, items)

    async def seal(self, file_id: str, count: int, crcs: dict[int, int]) -> list[int]:
        """Seal ``file_id``'s chunks here with these CRCs (seals.py); returns the
        indices of those not stored here with them (missing, or other bytes)."""
        check_file_id(file_id)
        seal, forgotten = await self.seals.seal(file_id, count, crcs)

        def keep_and_compare() -> list[int]:        # one thread hop for both
            self.seals.store(file_id, seal, forgotten)
            return self._differing(file_id, crcs)

        return await asyncio.to_thread(keep_and_compare)

    def _differing(self, file_id: str, crcs: dict[int, int]) -> list[int]:
        out = []
        for index, crc in sorted(crcs.items()):
            try:
                with self.store.open(chunk_id(file_id, index)) as oc:
                    same = oc.meta.crc == crc
            except StagerError:         # not there, or torn
                same = False
            if not same:
                out.append(index)
        return out

    async def unseal(self, file_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.seals.remove, self.seals.release(
            [check_file_id(f) for f in file_ids]))

    async def open(self, chunk: str) -> OpenChunk:
        return await asyncio.to_thread(self.store.open, chunk)

    async def delete(self, chunk: str) -> bool:
        return await asyncio.to_thread(self.store.delete, chunk)

    async def purge(self, file_ids: Sequence[str]) -> int:
        ids = [check_file_id(f) for f in file_ids]
        removed = sum([await asyncio.to_thread(self.store.purge, f) for f in ids])
        await self.unseal(ids)      # the file is gone: no chunk of it is read again
        return removed

    async def usage(self) -> Usage:
        return await asyncio.to_thread(self.store.usage)

    async def open_batch(self, items: Sequence[ReadItem]) -> BatchRead:
        """A batched read with every chunk opened once and every piece checked to fit
        its chunk (NotFound, RangeNotSatisfiable before any byte is sent)."""
        if len(items) > MAX_BATCH_ITEMS:
            raise BadRequest(f"at most {MAX_BATCH_ITEMS} items per batched read")
        opening = asyncio.ensure_future(asyncio.to_thread(BatchRead, self.store, items))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_opened)    # no file left open
            raise


def _close_opened(opening: asyncio.Future[BatchRead]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
