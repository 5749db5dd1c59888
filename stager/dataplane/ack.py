"""What the answer to a chunk write must prove before the copy counts.

A data server answers a chunk PUT with :class:`~stager.protocol.messages.ChunkStored`
and a chunk batch with :class:`~stager.protocol.messages.ChunkBatchStored`: for
every chunk it stored, the size and CRC32C read back from the chunk file it
wrote.  A 2xx alone proves nothing: a target whose disk dropped the write, a
broken proxy in front of a dead server, or a rogue that answers ``200 {}`` would
have the copy counted, the write acknowledged, and the read fail later.  So the
writer holds the answer against what it sent (its own CRC32C and byte count);
an answer that does not name a chunk it sent, or names it with another size or
CRC32C, makes the whole request a failed chunk write of that target
(:class:`~stager.errors.StorageError`, which every writer routes around as it
does a target that refused: :func:`stager.dataplane.writer.routes_around`).

Every chunk write goes through :class:`~stager.dataplane.transport.DataPlane`,
which checks its answer here: the striped writer (pipe, put, streams, fsspec,
the mount, the gateway), the batched writer (``write_many``) and the metadata
server's rebuild and repair copies.

This catches a broken target, not a malicious one: a target can compute the
CRC32C of what it was sent and drop the bytes all the same.  Keeping such a
target out is the work of server identity and join tokens (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgspec

from ..errors import BadRequest, StorageError
from ..protocol.messages import ChunkBatchStored, ChunkStored


def prove_put(target: str, answer: bytes, sent: ChunkStored) -> None:
    """The answer to a chunk PUT of ``sent`` (the chunk, the bytes and CRC32C the
    writer sent) proves it stored, or :class:`StorageError`.  The data server's answer
    is the compact JSON of what it stored: where it is byte for byte that of ``sent``,
    it proves it without being parsed (any other answer is parsed and checked)."""
    if answer == _ENCODE(sent.to_json()):
        return
    try:
        acks: Sequence[ChunkStored] = (ChunkStored.from_json(_json(answer)),)
    except BadRequest as exc:
        raise _unproven(target, sent, f"its answer is no ack ({exc})") from None
    prove(target, acks, (sent,))


_ENCODE = msgspec.json.Encoder().encode     # as the data server writes its answers


def prove_batch(target: str, answer: bytes, sent: Sequence[ChunkStored]) -> None:
    """The answer to a chunk batch of ``sent`` proves every chunk stored, or
    :class:`StorageError` (the batch failed on that target as a whole)."""
    try:
        acks = ChunkBatchStored.from_json(_json(answer)).stored
    except BadRequest as exc:
        raise _unproven(target, sent[0], f"its answer is no ack ({exc})") from None
    prove(target, acks, sent)


def prove(target: str, acks: Sequence[ChunkStored], sent: Sequence[ChunkStored]) -> None:
    """Every chunk of ``sent`` is in ``acks`` with the size and CRC32C sent."""
    by_chunk = {a.chunk: a for a in acks}
    for want in sent:
        got = by_chunk.get(want.chunk)
        if got is None:
            raise _unproven(target, want, "its answer does not name it")
        if (got.size, got.crc) != (want.size, want.crc):
            raise _unproven(target, want, f"it stored {got.size} bytes with CRC32C "
                                          f"{got.crc:08x}, not {want.size} with {want.crc:08x}")


def _json(answer: bytes) -> object:
    try:
        return json.loads(answer)
    except (ValueError, RecursionError):
        raise BadRequest("not JSON") from None


def _unproven(target: str, chunk: ChunkStored, why: str) -> StorageError:
    return StorageError(f"target {target} did not prove it stored chunk {chunk.chunk}: {why}",
                        target=target, chunk=chunk.chunk, unproven=True)
