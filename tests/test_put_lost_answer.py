"""A whole-file PUT retried after its answer was lost: the metadata server committed the
first try and died before recording its answer (stager/web/idempotency.py), so the
retry, with the same key, finds no recorded answer.  Its file id is the first try's
(derived from the key): written again, the commit would replace the file with itself
and the collection of the replaced id would purge the chunks both share.  The retry
answers the first try's file instead, or, where another writer replaced it since,
an error saying it was not written again."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import STORES, cluster_on_each_store

from stager import Client
from stager.meta.http.app import SERVICE
from stager.protocol.headers import ATTEMPT, IDEMPOTENCY_KEY
from stager.testing import ThreadCluster

# both stores: SQLite's commit and PostgreSQL's stager_commit (schema 15) each replace
# a row of the same file id without collecting its chunks
_cluster = pytest.fixture(scope="module", params=STORES, name="cluster")(cluster_on_each_store)


def put(http, cluster: ThreadCluster, path: str, body: bytes, key: str,  # type: ignore[no-untyped-def]
        attempt: int):
    return http(cluster.meta_url, "PUT", f"/v1/files{path}", body=body,
                headers={IDEMPOTENCY_KEY: key, ATTEMPT: str(attempt)})


def lose_recorded_answers(cluster: ThreadCluster) -> None:
    """What a server that died between the commit and the record leaves.  A whole-file
    PUT records no answer since 13c6247 (its retry finds its file itself), so this
    only makes sure no answer of the first try is left to replay."""
    assert cluster.meta is not None
    cluster.call(cluster.meta.app[SERVICE].store.expire_answers(float("inf")))


def collected(client: Client, path: str) -> None:
    """Give the collector (0.2 s apart in the test cluster) time to purge garbage."""
    time.sleep(1.5)
    client.stat(path, cached=False)


def test_a_retry_after_a_lost_answer_answers_the_file_the_first_try_made(
        cluster: ThreadCluster, http, client: Client, ns: str, payload) -> None:
    path, data, key = f"{ns}/lost.bin", payload(1000), uuid.uuid4().hex
    first = put(http, cluster, path, data, key, 1)
    assert first.status == 201
    lose_recorded_answers(cluster)
    again = put(http, cluster, path, data, key, 2)
    assert again.status == 201, again.body
    assert again.json()["file_id"] == first.json()["file_id"]
    collected(client, path)
    assert client.cat(path) == data             # its chunks were never collected


def test_a_retry_after_a_lost_answer_does_not_write_over_a_later_writer(
        cluster: ThreadCluster, http, client: Client, ns: str, payload) -> None:
    path, key = f"{ns}/raced.bin", uuid.uuid4().hex
    assert put(http, cluster, path, payload(1000), key, 1).status == 201
    client.pipe(path, b"later writer")
    lose_recorded_answers(cluster)
    again = put(http, cluster, path, payload(1000), key, 2)
    assert again.status == 404 and again.json()["error"] == "upload_not_found", again.body
    assert "not written again" in again.json()["message"]
    collected(client, path)
    assert client.cat(path) == b"later writer"


def test_a_put_sent_twice_as_a_first_try_keeps_its_chunks(
        cluster: ThreadCluster, http, client: Client, ns: str, payload) -> None:
    """aiohttp sends a PUT again, headers and all (``X-Stager-Attempt: 1``), when the
    keep-alive connection it went out on drops: the server takes the second for a
    first try and writes the file again under the same id.  Its commit replaces the
    file's row with itself, never its chunks."""
    path, data, key = f"{ns}/twice.bin", payload(1000), uuid.uuid4().hex
    first = put(http, cluster, path, data, key, 1)
    lose_recorded_answers(cluster)          # as a first try, it is not looked up anyway
    again = put(http, cluster, path, data, key, 1)
    assert (first.status, again.status) == (201, 201)
    assert again.json()["file_id"] == first.json()["file_id"]
    collected(client, path)
    assert client.cat(path) == data
