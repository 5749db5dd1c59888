"""The data service: a chunk store behind asyncio.  Knows nothing of HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..errors import BadRequest, RangeNotSatisfiable
from ..protocol.models import TARGET_ID_RE, ReadItem, check_file_id
from ..storage import ChunkStore, OpenChunk, Usage

MAX_BATCH_ITEMS = 65536
BATCH_SLICE = 4 << 20       # bytes read per thread hop in a batched read


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
        self.store = ChunkStore(root, capacity=config.capacity)

    async def put(self, chunk: str, data: bytes, crc: int) -> None:
        await asyncio.to_thread(self.store.put, chunk, data, crc)

    async def open(self, chunk: str) -> OpenChunk:
        return await asyncio.to_thread(self.store.open, chunk)

    async def delete(self, chunk: str) -> bool:
        return await asyncio.to_thread(self.store.delete, chunk)

    async def purge(self, file_ids: Sequence[str]) -> int:
        ids = [check_file_id(f) for f in file_ids]
        return sum([await asyncio.to_thread(self.store.purge, f) for f in ids])

    async def usage(self) -> Usage:
        return await asyncio.to_thread(self.store.usage)

    async def plan_batch(self, items: Sequence[ReadItem]) -> int:
        """Check that every piece exists and fits its chunk; returns the total length."""
        if len(items) > MAX_BATCH_ITEMS:
            raise BadRequest(f"at most {MAX_BATCH_ITEMS} items per batched read")

        def check() -> int:
            sizes: dict[str, int] = {}
            for item in items:
                if item.chunk not in sizes:
                    with self.store.open(item.chunk) as oc:
                        sizes[item.chunk] = oc.meta.data_len
                if item.offset + item.length > sizes[item.chunk]:
                    raise RangeNotSatisfiable(
                        f"{item.chunk}: [{item.offset}, {item.offset + item.length}) is past "
                        f"its {sizes[item.chunk]} bytes", chunk=item.chunk)
            return sum(i.length for i in items)

        return await asyncio.to_thread(check)

    async def batch(self, items: Sequence[ReadItem]) -> AsyncIterator[bytes]:
        """The pieces' bytes in order, verified, a few MiB per thread hop."""
        group: list[ReadItem] = []
        size = 0
        for item in items:
            group.append(item)
            size += item.length
            if size >= BATCH_SLICE:
                yield await asyncio.to_thread(self._read_group, group)
                group, size = [], 0
        if group:
            yield await asyncio.to_thread(self._read_group, group)

    def _read_group(self, items: list[ReadItem]) -> bytes:
        out = bytearray()
        opened: dict[str, OpenChunk] = {}
        try:
            for item in items:
                oc = opened.get(item.chunk)
                if oc is None:
                    oc = opened[item.chunk] = self.store.open(item.chunk)
                out += oc.read(item.offset, item.length)
        finally:
            for oc in opened.values():
                oc.close()
        return bytes(out)
