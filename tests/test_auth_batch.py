"""Batch capabilities: one signature for many files, and still only for those files.

The ``capabilities`` route answers one capability per batch of up to
``MAX_BATCH_FILES`` files (stager/auth/tokens.py); a data server verifies it once
and lets it read exactly the files it names, only for reading, only until it expires.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager import AsyncClient, Client
from stager.auth import b64, capability_allows
from stager.auth.tokens import (
    BATCH,
    MAX_BATCH_FILES,
    MAX_TEXT,
    Capability,
    sign,
    verify_capability,
)
from stager.config import load_config
from stager.errors import BadRequest, Unauthenticated
from stager.protocol.models import chunk_id
from stager.testing.cluster import ThreadCluster

KEY = Ed25519PrivateKey.generate()
HOLDER = "a" * 32


def ids(n: int) -> list[str]:
    return [secrets.token_hex(16) for _ in range(n)]


def test_a_batch_capability_round_trips_and_fits_in_one_text() -> None:
    files = ids(MAX_BATCH_FILES)
    cap = Capability.batch(files, "read", HOLDER, time.time())
    text = sign(KEY, cap)
    assert len(text) <= MAX_TEXT
    back = verify_capability(KEY.public_key(), text, time.time())
    assert back == cap and back.file_id == BATCH and back.files == frozenset(files)


def test_a_batch_capability_grants_its_files_and_no_other() -> None:
    files = ids(3)
    outside = ids(1)[0]
    cap = Capability.batch(files, "read", HOLDER, time.time())
    assert all(capability_allows(cap, f, "read") for f in files)
    assert not capability_allows(cap, outside, "read")
    assert not capability_allows(cap, BATCH, "read")        # the marker is no file
    assert not capability_allows(cap, files[0], "write")    # reads only
    assert not capability_allows(cap, None, "cluster")


@pytest.mark.parametrize("kwargs", [
    {"files": frozenset()},                                  # "+" with no files
    {"files": frozenset(ids(MAX_BATCH_FILES + 1))},
    {"files": frozenset(["not-a-file-id"])},
    # the ids are checked by one match over them joined by commas: none may hide a comma,
    # run two ids together, or be other than a string
    {"files": frozenset([",".join(ids(2))])},
    {"files": frozenset(["".join(ids(2))])},
    {"files": frozenset([ids(1)[0].upper()])},
    {"files": frozenset([ids(1)[0][:31]])},
    {"files": frozenset([*ids(2), 7])},
    {"files": ids(2)[0]},                                    # a string is no collection
    {"files": frozenset(ids(2)), "target": "t0"},            # a batch names no target
])
def test_bad_batches_are_a_bad_request(kwargs: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        Capability(BATCH, "read", int(time.time()) + 60, HOLDER, **kwargs)  # type: ignore


def test_only_a_batch_names_files() -> None:
    with pytest.raises(BadRequest):
        Capability(ids(1)[0], "read", int(time.time()) + 60, HOLDER,
                   files=frozenset(ids(2)))


def _signed(claims: dict[str, object]) -> str:
    payload = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    signed = f"stg1.{b64.encode(payload)}"
    return f"{signed}.{b64.encode(KEY.sign(signed.encode()))}"


@pytest.mark.parametrize("files", [
    b"",                                                     # no file
    bytes(range(16)) * 2,                                    # the same file twice
    bytes([2] * 16) + bytes([1] * 16),                       # out of order
    bytes(20),                                               # not whole ids
])
def test_a_signed_batch_that_is_not_canonical_is_refused(files: bytes) -> None:
    text = _signed({"typ": "cap", "files": b64.encode(files), "op": "read",
                    "exp": int(time.time()) + 60, "holder": HOLDER})
    with pytest.raises(Unauthenticated):
        verify_capability(KEY.public_key(), text, time.time())


def test_a_capability_names_a_file_or_a_batch_not_both() -> None:
    one = ids(1)[0]
    text = _signed({"typ": "cap", "file": one, "files": b64.encode(bytes.fromhex(one)),
                    "op": "read", "exp": int(time.time()) + 60, "holder": HOLDER})
    with pytest.raises(Unauthenticated):
        verify_capability(KEY.public_key(), text, time.time())


# -- against a cluster --------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("auth-batch")), auth=True)
    yield c
    c.stop()


def test_one_batch_capability_reads_its_files_and_no_other(cluster: ThreadCluster,
                                                          ns: str) -> None:
    token = cluster.mint(["read", "write"])
    with Client(cluster.meta_url, config=load_config(env={}), token=token) as c:
        c.write_many([(f"{ns}/{i}", bytes([i]) * 100) for i in range(3)])
        infos = [c.stat(f"{ns}/{i}") for i in range(3)]
    asked = [infos[0].file_id, infos[1].file_id]
    got = raw_http(cluster.meta_url, "POST", "/v1/capabilities",
                   json.dumps({"op": "read", "file_ids": asked}).encode(),
                   {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert got.status == 200, got.body
    batch, same = (r["capability"] for r in got.json()["results"])
    assert isinstance(batch, str) and same is None           # one signature for both,
                                                             # its text sent once

    def read(info: object, capability: str) -> int:
        where = info.locations[info.layout.targets[0]]       # type: ignore[attr-defined]
        return raw_http(where, "GET",
                        f"/v1/chunks/{chunk_id(info.file_id, 0)}",  # type: ignore[attr-defined]
                        headers={"X-Stager-Capability": capability}).status

    assert [read(i, batch) for i in infos[:2]] == [200, 200]
    assert read(infos[2], batch) == 403                     # a file outside the batch
    # and only reads: the batch is no write capability
    where = infos[0].locations[infos[0].layout.targets[0]]
    put = raw_http(where, "PUT", f"/v1/chunks/{chunk_id(infos[0].file_id, 0)}", b"x",
                   {"X-Stager-Capability": batch})
    assert put.status == 403


def test_a_batch_is_only_for_files_the_token_may_read(cluster: ThreadCluster,
                                                      ns: str) -> None:
    with Client(cluster.meta_url, config=load_config(env={}),
                token=cluster.mint(["read", "write"])) as c:
        c.write_many([(f"{ns}/in/a", b"a"), (f"{ns}/out/b", b"b")])
        inside, outside = c.stat(f"{ns}/in/a").file_id, c.stat(f"{ns}/out/b").file_id
    narrow = cluster.mint(["read"], (f"{ns}/in",))
    got = raw_http(cluster.meta_url, "POST", "/v1/capabilities",
                   json.dumps({"op": "read", "file_ids": [inside, outside]}).encode(),
                   {"Authorization": f"Bearer {narrow}", "Content-Type": "application/json"})
    assert got.status == 403 and got.json()["error"] == "forbidden"


async def test_a_plan_fetches_scattered_capabilities_anew_as_one_batch(
        cluster: ThreadCluster, ns: str) -> None:
    token = cluster.mint(["read", "write"])
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        await c.write_many([(f"{ns}/{i}", b"x") for i in range(12)])
        ids = [(await c.stat(f"{ns}/{i}")).file_id for i in range(12)]
        book = c.capabilities
        assert book is not None
        held = await book.header("read", ids)       # one capability each, from the stats
        assert held is not None and len(held.split()) == 12
        await book.plan("read", ids)
        fetched = book.fetched
        again = await book.header("read", ids)
        assert again is not None and len(again.split()) == 1
        await book.plan("read", ids)                # compact now: nothing fetched
        assert book.fetched == fetched
        # and the one batch reads every file through the data servers
        assert [await c.cat(f"{ns}/{i}") for i in range(12)] == [b"x"] * 12
