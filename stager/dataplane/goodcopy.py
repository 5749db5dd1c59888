"""A chunk's bytes from the first replica that holds them intact.

The writer's copy after a reroute (:mod:`.writer`) and the metadata server's
rebuild and repair (:mod:`stager.meta.upkeep.copier`) both copy a stored chunk to a new
target: each reads it here, whole, checked against its CRC32C, replica after
replica until one is good.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..checksum import crc32c
from ..errors import ChunkNotFound, CorruptChunk, StagerError, Unavailable
from .transport import DataPlane

log = logging.getLogger("stager.dataplane")


async def read_good_copy(plane: DataPlane, chunk: str, sources: Sequence[tuple[str, str]],
                         out: memoryview, crc: int | None = None) -> int:
    """Fill ``out`` with all of ``chunk`` from the first of ``sources`` (target id,
    URL), in order, whose bytes match ``crc`` (``None``: the CRC32C the data server
    keeps with it); returns that CRC.  Only the last source is waited for patiently:
    no other replica is left then.

    Raises :class:`Unavailable` naming each source's failure; its detail
    ``answered`` is true when every source answered (the chunk missing or corrupt
    there), so that trying again later cannot do better.
    """
    errors: list[BaseException] = []
    answered = True
    for i, (target, url) in enumerate(sources):
        try:
            stored = await plane.read_chunk_into(target, url, chunk, 0, out, whole=True,
                                                 patient=i == len(sources) - 1)
        except (ChunkNotFound, CorruptChunk) as exc:
            errors.append(exc)
            continue
        except (StagerError, OSError) as exc:
            errors.append(exc)
            answered = False
            continue
        expected = crc if crc is not None else stored
        if expected is not None and crc32c(out) == expected:
            return expected
        log.warning("chunk %s on %s does not match its checksum", chunk, target)
        errors.append(CorruptChunk(f"copy of {chunk} on {target} does not match",
                                   target=target))
    raise Unavailable(f"chunk {chunk}: no good copy to read from "
                      f"({'; '.join(map(str, errors)) or 'no replica left'})",
                      chunk=chunk, answered=answered)
