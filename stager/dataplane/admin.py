"""Maintenance requests to data servers: list chunks, scrub a target, delete a chunk.

Used by the metadata server's rebuild, repair and fsck (stager/meta/).  Long
answers are streamed as JSON lines and end with a ``{"done": true, …}`` line,
so a stream cut short by a dying server is told apart from a complete one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..errors import TRANSPORT_FAILURES, TargetUnavailable, unreachable
from ..protocol.messages import ChunkDeleted, ScrubRequest
from ..protocol.routes import route
from .transport import DataPlane


@dataclass(frozen=True)
class StoredChunk:
    """A chunk file as a data server lists it."""

    name: str
    size: int        # bytes on disk, trailer included
    mtime: float


async def _lines(resp: aiohttp.ClientResponse, target: str) -> AsyncIterator[Any]:
    """The JSON values of a JSON-lines body; raises unless it ended with a done line."""
    try:
        async for raw in resp.content:
            if not raw.strip():
                continue
            value = json.loads(raw)
            if isinstance(value, dict) and value.get("done"):
                yield value
                return
            yield value
    except (*TRANSPORT_FAILURES, ValueError) as exc:    # ValueError: a line cut short
        raise unreachable(exc, f"target {target}: stream broken", target=target) from exc
    raise TargetUnavailable(f"target {target}: stream ended early", target=target)


async def list_chunks(plane: DataPlane, target: str, url: str) -> AsyncIterator[StoredChunk]:
    """Every chunk stored on ``target``."""
    async with plane.request(target, url, route("list_chunks")) as resp:
        async for value in _lines(resp, target):
            if isinstance(value, list):
                name, size, mtime = value
                yield StoredChunk(str(name), int(size), float(mtime))


async def scrub_target(plane: DataPlane, target: str, url: str,
                       rate: int | None = None) -> dict[str, Any]:
    """Have ``target`` verify every chunk now; its final report (``corrupt`` names)."""
    async with plane.request(target, url, route("scrub_chunks"),
                             json_body=ScrubRequest(rate).to_json()) as resp:
        last: dict[str, Any] = {}
        async for value in _lines(resp, target):
            if isinstance(value, dict):
                last = value
        return last


async def delete_chunk(plane: DataPlane, target: str, url: str, chunk: str) -> bool:
    async with plane.request(target, url, route("delete_chunk"), chunk=chunk) as resp:
        return ChunkDeleted.from_json(await resp.json()).deleted
