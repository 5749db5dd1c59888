"""The whole-file HTTP gateway of the metadata server, Range handling per RFC 9110."""

from __future__ import annotations

import pytest

from stager import Client
from stager.protocol.models import LayoutSpec
from stager.protocol.ranges import parse_range
from stager.testing import ThreadCluster

SMALL = 64 * 1024
SIZE = SMALL * 3 + 500


@pytest.fixture
def stored(client: Client, ns: str, payload) -> tuple[str, bytes]:
    """A file of SIZE bytes over 64 KiB chunks; returns its gateway URL path and bytes."""
    data = payload(SIZE)
    client.pipe(f"{ns}/file.bin", data, layout=LayoutSpec(chunk_size=SMALL))
    return f"/v1/files{ns}/file.bin", data


def test_get_whole_file(cluster: ThreadCluster, http, stored) -> None:
    url, data = stored
    r = http(cluster.meta_url, "GET", url)
    assert r.status == 200
    assert r.body == data
    assert r.headers["Content-Length"] == str(SIZE)
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert r.headers["ETag"] and r.headers["Last-Modified"].endswith("GMT")
    assert "Content-Range" not in r.headers


@pytest.mark.parametrize("header, start, stop", [
    ("bytes=0-0", 0, 1),
    ("bytes=10-19", 10, 20),
    (f"bytes={SMALL - 1}-{SMALL}", SMALL - 1, SMALL + 1),           # across a chunk edge
    (f"bytes={SMALL}-", SMALL, SIZE),                                # open-ended
    ("bytes=-100", SIZE - 100, SIZE),                                # suffix
    (f"bytes=-{SIZE * 2}", 0, SIZE),                                 # suffix longer than file
    (f"bytes=100-{SIZE * 5}", 100, SIZE),                            # end past the end: clipped
    (f"bytes={SIZE - 1}-", SIZE - 1, SIZE),                          # last byte
    ("BYTES = 5 - 9", 5, 10),                                        # case and spaces
])
def test_satisfiable_ranges(cluster: ThreadCluster, http, stored, header: str, start: int,
                            stop: int) -> None:
    url, data = stored
    r = http(cluster.meta_url, "GET", url, headers={"Range": header})
    assert r.status == 206, r.body
    assert r.body == data[start:stop]
    assert r.headers["Content-Range"] == f"bytes {start}-{stop - 1}/{SIZE}"
    assert r.headers["Content-Length"] == str(stop - start)


@pytest.mark.parametrize("header", [
    f"bytes={SIZE}-",                 # start at the end
    f"bytes={SIZE + 10}-{SIZE + 20}", # start past the end
    "bytes=-0",                       # empty suffix
    "bytes=abc",                      # malformed
    "bytes=5-2",                      # last before first
    "bytes=",                         # nothing
    "bytes=-",
    "bytes=1-2-3",
])
def test_unsatisfiable_or_malformed_ranges(cluster: ThreadCluster, http, stored,
                                           header: str) -> None:
    url, _ = stored
    r = http(cluster.meta_url, "GET", url, headers={"Range": header})
    assert r.status == 416
    assert r.headers["Content-Range"] == f"bytes */{SIZE}"
    body = r.json()
    assert body["error"] == "range_not_satisfiable" and body["message"]


@pytest.mark.parametrize("header", [
    "bytes=0-1,5-9",       # several ranges: the server may answer the whole thing
    "bytes=0-1, 5-",
    "items=0-5",           # another unit: ignored
    "bytesx=0-5",          # a different unit that merely starts with "bytes"
])
def test_ignored_ranges_give_the_whole_file(cluster: ThreadCluster, http, stored,
                                            header: str) -> None:
    url, data = stored
    r = http(cluster.meta_url, "GET", url, headers={"Range": header})
    assert r.status == 200
    assert r.body == data
    assert "Content-Range" not in r.headers


def test_empty_file(cluster: ThreadCluster, http, ns: str) -> None:
    assert http(cluster.meta_url, "PUT", f"/v1/files{ns}/empty", body=b"").status == 201
    r = http(cluster.meta_url, "GET", f"/v1/files{ns}/empty")
    assert (r.status, r.body, r.headers["Content-Length"]) == (200, b"", "0")
    r = http(cluster.meta_url, "GET", f"/v1/files{ns}/empty", headers={"Range": "bytes=0-"})
    assert r.status == 416 and r.headers["Content-Range"] == "bytes */0"


def test_head(cluster: ThreadCluster, http, stored, ns: str) -> None:
    url, _ = stored
    r = http(cluster.meta_url, "HEAD", url)
    assert r.status == 200
    assert r.body == b""
    assert r.headers["Content-Length"] == str(SIZE)
    assert r.headers["Accept-Ranges"] == "bytes"
    assert http(cluster.meta_url, "HEAD", f"/v1/files{ns}/missing").status == 404
    d = http(cluster.meta_url, "HEAD", f"/v1/files{ns}")
    assert d.status == 200 and d.headers["Content-Type"].startswith("application/json")


def test_put_creates_and_replaces(cluster: ThreadCluster, http, client: Client, ns: str,
                                  payload) -> None:
    data = payload(SMALL * 2 + 1)
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/new/deep/p.bin?chunk_size={SMALL}"
             f"&stripe_count=2&replicas=2", body=data)
    assert r.status == 201
    info = r.json()
    assert info["path"] == f"{ns}/new/deep/p.bin" and info["size"] == len(data)
    assert info["layout"]["chunk_size"] == SMALL
    assert info["layout"]["stripe_count"] == 2 and info["layout"]["replicas"] == 2
    assert client.cat(f"{ns}/new/deep/p.bin") == data
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/new/deep/p.bin", body=b"second")
    assert r.status == 201
    assert http(cluster.meta_url, "GET", f"/v1/files{ns}/new/deep/p.bin").body == b"second"


def test_put_with_chunked_transfer_encoding(cluster: ThreadCluster, http, client: Client,
                                            ns: str, payload) -> None:
    data = payload(SMALL + 7)

    def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(data), 10_000):
            yield data[i:i + 10_000]

    # http.client sends an iterable without a length with Transfer-Encoding: chunked
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/chunked.bin", body=chunks())
    assert r.status == 201, r.body
    assert client.cat(f"{ns}/chunked.bin") == data


def test_put_bad_layout_query_and_onto_directory(cluster: ThreadCluster, http, client: Client,
                                                 ns: str) -> None:
    client.mkdir(f"{ns}/dir")
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/x?chunk_size=lots", body=b"x")
    assert r.status == 400 and r.json()["error"] == "bad_request"
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/x?chunk_size=1000", body=b"x")
    assert r.status == 400 and r.json()["error"] == "invalid_layout"
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/dir", body=b"x")
    assert r.status == 409 and r.json()["error"] == "is_a_directory"
    assert not client.exists(f"{ns}/x")


def test_delete_file_and_directory(cluster: ThreadCluster, http, client: Client,
                                   ns: str) -> None:
    client.pipe(f"{ns}/d/a", b"a")
    client.pipe(f"{ns}/d/b", b"b")
    client.pipe(f"{ns}/f", b"f")
    r = http(cluster.meta_url, "DELETE", f"/v1/files{ns}/f")
    assert r.status == 200 and r.json() == {"removed": 1}
    assert http(cluster.meta_url, "GET", f"/v1/files{ns}/f").status == 404
    r = http(cluster.meta_url, "DELETE", f"/v1/files{ns}/d")
    assert r.status == 409 and r.json()["error"] == "not_empty"
    assert client.cat(f"{ns}/d/a") == b"a"
    r = http(cluster.meta_url, "DELETE", f"/v1/files{ns}/d?recursive=true")
    assert r.status == 200 and r.json() == {"removed": 2}
    assert not client.exists(f"{ns}/d")
    assert http(cluster.meta_url, "DELETE", f"/v1/files{ns}/d").status == 404


def test_get_directory_lists_it_in_pages(cluster: ThreadCluster, http, client: Client,
                                         ns: str) -> None:
    for i in range(5):
        client.pipe(f"{ns}/f{i}", b"x" * i)
    r = http(cluster.meta_url, "GET", f"/v1/files{ns}")
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
    listing = r.json()
    assert [e["path"] for e in listing["entries"]] == [f"{ns}/f{i}" for i in range(5)]
    assert [e["size"] for e in listing["entries"]] == [0, 1, 2, 3, 4]
    assert listing["next"] is None
    page = http(cluster.meta_url, "GET", f"/v1/files{ns}/?limit=2").json()
    assert [e["path"] for e in page["entries"]] == [f"{ns}/f0", f"{ns}/f1"]
    assert page["next"] == "f1"
    page = http(cluster.meta_url, "GET", f"/v1/files{ns}?limit=2&after={page['next']}").json()
    assert [e["path"] for e in page["entries"]] == [f"{ns}/f2", f"{ns}/f3"]
    root = http(cluster.meta_url, "GET", "/v1/files/").json()
    assert ns in [e["path"] for e in root["entries"]]


def test_percent_encoded_names(cluster: ThreadCluster, http, client: Client, ns: str) -> None:
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/a%20b%C3%A9.txt", body=b"spaces")
    assert r.status == 201
    assert r.json()["path"] == f"{ns}/a bé.txt"
    assert client.cat(f"{ns}/a bé.txt") == b"spaces"
    assert http(cluster.meta_url, "GET", f"/v1/files{ns}/a%20b%C3%A9.txt").body == b"spaces"


def test_large_ranged_read_across_default_chunks(cluster: ThreadCluster, http, client: Client,
                                                 ns: str, payload) -> None:
    chunk = 4 * 1024 * 1024
    data = payload(chunk * 2 + 3)
    client.pipe(f"{ns}/big", data)
    r = http(cluster.meta_url, "GET", f"/v1/files{ns}/big",
             headers={"Range": f"bytes={chunk - 5}-{2 * chunk + 1}"})
    assert r.status == 206 and r.body == data[chunk - 5:2 * chunk + 2]


def test_parse_range_unit() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=2-4", 10) == (2, 5)
    assert parse_range("bytes=-3", 10) == (7, 10)
    assert parse_range("bytes=8-", 10) == (8, 10)
    assert parse_range("bytes=0-1,2-3", 10) is None
    assert parse_range("pages=1-2", 10) is None
    assert parse_range("bytesx=1-2", 10) is None
