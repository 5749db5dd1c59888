"""One read of "a CRC-checked copy from the first good replica" (stager/dataplane/goodcopy.py),
used by the writer's copy after a reroute and the metadata server's copier, and one
decision "a full target is not a dead one" (stager/dataplane/writer.py: only_full),
used by the writer, the copier and the reroute route."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from stager.checksum import crc32c
from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.dataplane.goodcopy import read_good_copy
from stager.dataplane.writeengine import only_full
from stager.errors import InsufficientStorage, StorageError, Unavailable
from stager.testing import ThreadCluster

DEAD = "http://127.0.0.1:9"          # nothing listens there: refused at once


@pytest.fixture
async def plane() -> AsyncIterator[DataPlane]:
    options = PlaneOptions(retries=0)
    async with make_session(options) as session:
        yield DataPlane(session, options)


def replicas(cluster: ThreadCluster) -> list[tuple[str, str]]:
    out = []
    for i in range(2):
        server = cluster.data[i]
        assert server is not None
        out.append((cluster.target_id(i), server.url))
    return out


async def test_the_first_good_copy_is_read_past_a_corrupt_one(
        cluster: ThreadCluster, plane: DataPlane, payload) -> None:
    good, bad = replicas(cluster)
    chunk = f"{uuid.uuid4().hex}.0"
    data, other = payload(100_000), payload(100_001)[1:]
    await plane.put_chunk(*good, chunk, data, crc32c(data))
    await plane.put_chunk(*bad, chunk, other, crc32c(other))   # same id, other bytes
    out = bytearray(len(data))
    assert await read_good_copy(plane, chunk, [bad, good], memoryview(out),
                                crc32c(data)) == crc32c(data)
    assert out == data
    # Without a committed checksum, the one the data server keeps is trusted.
    assert await read_good_copy(plane, chunk, [bad], memoryview(out)) == crc32c(other)


async def test_no_good_copy_says_whether_every_replica_answered(
        cluster: ThreadCluster, plane: DataPlane, payload) -> None:
    first, second = replicas(cluster)
    chunk = f"{uuid.uuid4().hex}.0"
    data = payload(5000)
    await plane.put_chunk(*first, chunk, data, crc32c(data))
    out = memoryview(bytearray(len(data)))
    with pytest.raises(Unavailable) as missing:     # corrupt on one, missing on the other
        await read_good_copy(plane, chunk, [first, second], out, crc32c(data) ^ 1)
    assert missing.value.details["answered"] is True
    with pytest.raises(Unavailable) as down:
        await read_good_copy(plane, chunk, [second, ("dead", DEAD)], out, crc32c(data))
    assert down.value.details["answered"] is False


def test_a_full_target_is_not_a_dead_one() -> None:
    full = InsufficientStorage("target full")
    assert only_full(full) and only_full(full.code)
    for dead in (Unavailable("refused"), StorageError("EIO")):
        assert not only_full(dead) and not only_full(dead.code)
