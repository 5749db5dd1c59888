"""A small file's PUT makes one store write: its upload's record waits for its chunk
and shares its commit's transaction (stager/meta/http/gateway.py ``_Record``).

Real servers on loopback (the module's cluster), the real SQLite store, whose
thread counts the transactions calls shared; a larger PUT still records its upload
while its chunks go out, and a small PUT whose chunk cannot be stored leaves no
upload behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stager import Client
from stager.client.async_client import SMALL_FILE
from stager.meta.http.app import SERVICE
from stager.meta.store.sqlite.store import SQLiteStore
from stager.meta.store.sqlite.thread import StoreThread
from stager.protocol.headers import ATTEMPT, IDEMPOTENCY_KEY
from stager.testing import ThreadCluster


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    """A cluster whose loop is not in asyncio's debug mode (the module's is): there,
    the traceback each new task keeps reads source lines, and the store thread may
    take a call between two queued in one pass of the loop."""
    with ThreadCluster(Path(tmp_path_factory.mktemp("quiet")), data_servers=1) as c:
        yield c


def store_thread(cluster: ThreadCluster) -> StoreThread:
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    assert isinstance(store, SQLiteStore)
    return store.thread


def test_a_small_put_records_its_upload_in_its_commits_transaction(
        quiet: ThreadCluster, ns: str) -> None:
    thread, puts, client = store_thread(quiet), 8, Client(quiet.meta_url)
    groups, calls = thread.groups, thread.grouped_calls
    for i in range(puts):
        client.pipe(f"{ns}/small{i}", b"s" * 1024)
    # each put's record and commit went to the store thread together: one transaction
    # (a heartbeat's write may land in one too, and a look for quotas, once a
    # second, can come between the two; before, none was grouped)
    assert thread.groups - groups >= puts // 2
    assert thread.grouped_calls - calls >= 2 * (puts // 2)
    assert all(client.cat(f"{ns}/small{i}") == b"s" * 1024 for i in range(puts))


def pending(cluster: ThreadCluster, ns: str) -> list[str]:
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    return [u.path for u in cluster.call(store.expired_uploads(float("inf")))
            if u.path.startswith(ns + "/")]


def test_a_larger_put_and_a_failed_small_put_leave_no_upload(
        quiet: ThreadCluster, ns: str, http) -> None:
    client = Client(quiet.meta_url)
    data = b"L" * (SMALL_FILE + 1)
    client.pipe(f"{ns}/large", data)
    assert client.cat(f"{ns}/large") == data
    assert pending(quiet, ns) == []
    # its one data server gone (the metadata server does not know yet): the chunk's
    # write fails, its reroute finds no other target, and the upload is abandoned
    quiet.stop_data(0)
    answer = http(quiet.meta_url, "PUT", f"/v1/files{ns}/failed", body=b"small")
    assert answer.status == 503, answer.body
    assert pending(quiet, ns) == []


@pytest.mark.parametrize("size", [1024, 4 * 1024 * 1024 + 1])    # one chunk; two
def test_a_keyed_put_that_failed_is_written_by_its_retry(
        tmp_path: Path, http, size: int) -> None:
    """A keyed PUT whose chunk could not be stored (503) leaves its upload for its
    retry, which writes the file: abandoned, the key's file id was retired, and the
    retry was refused as a file "committed, then replaced" that no try committed."""
    key, body = uuid.uuid4().hex, bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    with ThreadCluster(tmp_path, data_servers=1) as c:
        c.stop_data(0)
        first = http(c.meta_url, "PUT", "/v1/files/d/f", body=body,
                     headers={IDEMPOTENCY_KEY: key, ATTEMPT: "1"})
        assert first.status == 503, first.body
        c.start_data(0)
        c.wait_targets(1)
        again = http(c.meta_url, "PUT", "/v1/files/d/f", body=body,
                     headers={IDEMPOTENCY_KEY: key, ATTEMPT: "2"})
        assert again.status == 201, again.body
        assert Client(c.meta_url).cat("/d/f") == body
        assert pending(c, "/d") == []
