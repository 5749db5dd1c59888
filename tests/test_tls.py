"""TLS: a private CA, HTTPS servers, clients that trust the CA and refuse what it did not sign.

Real servers throughout: a :class:`ThreadCluster` with ``tls=True`` (its CA under
its root), and ``stager up --tls`` through :class:`ProcessCluster` with the CLI
run as a subprocess.  The core round trips run again over TLS in
``tests/test_tls_roundtrip.py``.
"""

from __future__ import annotations

import json
import socket
import ssl
import stat
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from test_cli import assert_clean_error, stager

from stager import AsyncClient, Client
from stager.auth.tls import (
    TlsFiles,
    client_context,
    ensure_cluster_tls,
    server_context,
    tls_pair,
)
from stager.config import load_config
from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.errors import Unavailable
from stager.protocol.models import LayoutSpec
from stager.testing import ProcessCluster, ThreadCluster
from stager.web.server import start_sites, stop_sites

pytestmark = pytest.mark.slow      # stager processes and the CLI: not in make check

SMALL = 64 * 1024


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    """Three data servers and a metadata server, all HTTPS, replicas 2."""
    from conftest import start_cluster

    c = start_cluster(tmp_path_factory.mktemp("tls"), tls=True, replicas=2)
    yield c
    c.stop()


def trusting(cluster: ThreadCluster) -> Client:
    return Client(cluster.meta_url, config=load_config({"ca_file": cluster.config.ca_file},
                                                       env={}))


# -- certificates ----------------------------------------------------------------------

def test_the_ca_signs_a_server_certificate_for_every_local_name(tmp_path: Path) -> None:
    files = ensure_cluster_tls(tmp_path / "tls", ["data.example"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {*san.get_values_for_type(x509.DNSName),
             *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}
    assert {"127.0.0.1", "::1", "localhost", socket.gethostname(), "data.example"} <= names
    for key in (files.ca_key, files.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for public in (files.ca_cert, files.cert):
        assert stat.S_IMODE(public.stat().st_mode) == 0o644


def test_certificates_are_made_once_and_a_new_name_keeps_the_ca(tmp_path: Path) -> None:
    first = ensure_cluster_tls(tmp_path)
    ca, cert = first.ca_cert.read_bytes(), first.cert.read_bytes()
    again = ensure_cluster_tls(tmp_path)
    assert (again.ca_cert.read_bytes(), again.cert.read_bytes()) == (ca, cert)
    wider = ensure_cluster_tls(tmp_path, ["other.example"])
    assert wider.ca_cert.read_bytes() == ca            # clients holding the CA still trust it
    assert wider.cert.read_bytes() != cert
    assert stat.S_IMODE(wider.key.stat().st_mode) == 0o600


def test_a_server_needs_both_certificate_and_key() -> None:
    assert tls_pair("", "") is None
    assert tls_pair("c.pem", "k.pem") == ("c.pem", "k.pem")
    with pytest.raises(ValueError, match="tls_cert is set but tls_key is not"):
        tls_pair("c.pem", "")


@pytest.mark.parametrize("given", ["--tls-cert", "--tls-key"])
def test_a_server_given_one_of_the_pair_refuses_to_start(tmp_path: Path, given: str) -> None:
    files = ensure_cluster_tls(tmp_path / "tls")
    out = stager("meta", "--root", str(tmp_path / "meta"), "--port", "0",
                 given, str(files.cert), meta=None, check=False)
    err = assert_clean_error(out, "TLS needs both")
    assert len(err.strip().splitlines()) == 1


# -- a TLS cluster -----------------------------------------------------------------------

def test_every_server_advertises_https(tls_cluster: ThreadCluster) -> None:
    assert tls_cluster.meta_url.startswith("https://")
    assert all(s is not None and s.url.startswith("https://") for s in tls_cluster.data)
    assert tls_cluster.config.public_url.startswith("https://")


def test_put_get_cat_round_trip_with_replicas(tls_cluster: ThreadCluster, ns: str,
                                              payload, tmp_path: Path) -> None:
    data = payload(SMALL * 7 + 3)
    with trusting(tls_cluster) as client:
        info = client.pipe(f"{ns}/a.bin", data, layout=LayoutSpec(chunk_size=SMALL))
        assert info.layout is not None and info.layout.replicas == 2
        assert info.layout.stripe_count == 3
        assert client.cat(f"{ns}/a.bin") == data
        assert client.cat(f"{ns}/a.bin", SMALL - 5, 3 * SMALL + 9) == data[SMALL - 5:3 * SMALL + 9]
        src = tmp_path / "src.bin"
        src.write_bytes(data[::-1])
        client.put(str(src), f"{ns}/b.bin")
        client.get(f"{ns}/b.bin", str(tmp_path / "back.bin"))
        assert (tmp_path / "back.bin").read_bytes() == data[::-1]


def test_striped_reads_fail_over_to_replicas_over_tls(tls_cluster: ThreadCluster, ns: str,
                                                      payload) -> None:
    data = payload(SMALL * 9 + 1)
    with trusting(tls_cluster) as client:
        client.pipe(f"{ns}/r.bin", data, layout=LayoutSpec(chunk_size=SMALL))
        tls_cluster.stop_data(1)
        try:
            assert client.cat(f"{ns}/r.bin") == data
        finally:
            tls_cluster.start_data(1)
            tls_cluster.wait_targets(3)


async def test_chunk_reads_over_tls_take_the_raw_path(tls_cluster: ThreadCluster, ns: str,
                                                      payload) -> None:
    data = payload(4 * 1024 * 1024 * 2 + 17)       # whole 4 MiB chunks: long bodies
    config = load_config({"ca_file": tls_cluster.config.ca_file}, env={})
    async with AsyncClient(tls_cluster.meta_url, config=config) as client:
        await client.pipe(f"{ns}/big.bin", data)
        assert await client.cat(f"{ns}/big.bin") == data
        raw = client.plane.session.connector.raw           # type: ignore[union-attr]
        assert len(raw._all) >= 1                           # reads went by recv_into


def test_the_gateway_serves_files_over_https(tls_cluster: ThreadCluster, ns: str,
                                             payload) -> None:
    data = payload(SMALL * 3 + 1)
    context = client_context(tls_cluster.config.ca_file)
    url = f"{tls_cluster.meta_url}/v1/files{ns}/g.bin"
    put = urllib.request.Request(url, data=data, method="PUT")
    with urllib.request.urlopen(put, context=context, timeout=30) as resp:
        assert resp.status == 201
    with urllib.request.urlopen(url, context=context, timeout=30) as resp:
        assert resp.read() == data


def test_a_client_without_the_ca_fails_with_a_certificate_error(tls_cluster: ThreadCluster,
                                                                ns: str) -> None:
    start = time.monotonic()
    with Client(tls_cluster.meta_url, config=load_config(env={})) as client, \
            pytest.raises(Unavailable) as caught:
        client.ls("/")
    assert time.monotonic() - start < 10
    message = str(caught.value)
    assert "certificate not trusted" in message and "--ca" in message
    assert "Traceback" not in message and "\n" not in message


def test_plain_http_to_a_tls_server_fails_cleanly(tls_cluster: ThreadCluster) -> None:
    plain = tls_cluster.meta_url.replace("https://", "http://")
    start = time.monotonic()
    with Client(plain, config=load_config({"retries": 0}, env={})) as client, \
            pytest.raises(Unavailable, match="unreachable") as caught:
        client.ls("/")
    assert "use an https:// URL" in str(caught.value)
    assert time.monotonic() - start < 10


def test_https_to_a_plain_server_fails_cleanly(cluster: ThreadCluster,
                                               tls_cluster: ThreadCluster) -> None:
    tls_url = cluster.meta_url.replace("http://", "https://")
    config = load_config({"ca_file": tls_cluster.config.ca_file, "retries": 0}, env={})
    with Client(tls_url, config=config) as client, \
            pytest.raises(Unavailable, match="unreachable"):
        client.ls("/")


# -- the raw read client over TLS, against a bare aiohttp server -------------------------

@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, TlsFiles]]:
    files = ensure_cluster_tls(tmp_path / "tls")
    body = bytes(range(256)) * (24 * 1024)                   # 6 MiB: past the low mark

    async def chunk(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"X-Stager-Crc32c": "0000abcd"})

    app = web.Application()
    app.router.add_get("/v1/chunks/{chunk}", chunk)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sockets = await start_sites(runner, "127.0.0.1", 0,
                                ssl_context=server_context(files.cert, files.key))
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}", files
    finally:
        await stop_sites(runner, sockets)


async def test_raw_reads_over_tls_land_in_the_buffer_and_reuse_one_connection(
        tls_server: tuple[str, TlsFiles]) -> None:
    url, files = tls_server
    options = PlaneOptions(ca_file=str(files.ca_cert))
    async with make_session(options) as session:
        plane = DataPlane(session, options)
        buf = bytearray(6 * 1024 * 1024)
        for _ in range(3):
            crc = await plane.read_chunk_into("t0", url, "ab" * 16 + ".0", 0, memoryview(buf),
                                              whole=True)
            assert crc == 0xABCD and bytes(buf) == bytes(range(256)) * (24 * 1024)
        assert len(session.connector.raw._all) == 1          # type: ignore[union-attr]
        assert plane.counters["t0"].requests == 3


async def test_raw_reads_refuse_a_server_the_ca_did_not_sign(
        tls_server: tuple[str, TlsFiles], tmp_path: Path) -> None:
    url, _ = tls_server
    other = ensure_cluster_tls(tmp_path / "other")            # another CA altogether
    options = PlaneOptions(ca_file=str(other.ca_cert), connect_timeout=2.0)
    async with make_session(options) as session:
        plane = DataPlane(session, options)
        with pytest.raises(Unavailable, match="certificate not trusted"):
            await plane.read_chunk_into("t0", url, "ab" * 16 + ".0", 0,
                                        memoryview(bytearray(10)))


# -- stager up --tls ---------------------------------------------------------------------

def test_stager_up_tls_and_the_cli_with_ca(tmp_path: Path, payload) -> None:
    root = tmp_path / "up"
    data = payload(SMALL * 5 + 2)
    local = tmp_path / "local.bin"
    local.write_bytes(data)
    with ProcessCluster(root, 2, tls=True) as c:
        info = json.loads((root / "cluster.json").read_text())
        assert info["ca_file"] == str((root / "tls" / "ca.pem").resolve())
        assert info["meta"]["url"].startswith("https://")
        assert all(d["url"].startswith("https://") for d in info["data"])
        for key in ("ca.key", "server.key"):
            assert stat.S_IMODE((root / "tls" / key).stat().st_mode) == 0o600
        stager("--ca", c.ca_file, "put", str(local), "/x.bin", meta=c.meta_url)
        assert stager("--ca", c.ca_file, "cat", "/x.bin", meta=c.meta_url).stdout == data
        by_env = stager("cat", "/x.bin", meta=c.meta_url, env={"STAGER_CA_FILE": c.ca_file})
        assert by_env.stdout == data
        refused = stager("cat", "/x.bin", meta=c.meta_url, check=False)
        err = assert_clean_error(refused, "certificate not trusted", "--ca")
        assert len(err.strip().splitlines()) == 1
        ca = (root / "tls" / "ca.pem").read_bytes()
    with ProcessCluster(root, 2, tls=True) as c:              # a restart reuses the CA
        assert (root / "tls" / "ca.pem").read_bytes() == ca
        assert stager("--ca", c.ca_file, "cat", "/x.bin", meta=c.meta_url).stdout == data


def test_server_context_refuses_plain_tls_versions_below_1_2(tmp_path: Path) -> None:
    files = ensure_cluster_tls(tmp_path)
    assert server_context(files.cert, files.key).minimum_version == ssl.TLSVersion.TLSv1_2
    assert client_context(files.ca_cert).check_hostname


def test_auth_and_tls_together(tmp_path: Path, payload) -> None:
    """Tokens ride inside TLS: a data server fetches the public key and registers over
    https, a client's token and capabilities reach both kinds of server."""
    from conftest import start_cluster

    c = start_cluster(tmp_path / "c", data_servers=2, tls=True, auth=True)
    try:
        token = c.mint(["read", "write"])
        config = load_config({"ca_file": c.config.ca_file, "token": token}, env={})
        data = payload(SMALL * 3 + 7)
        with Client(c.meta_url, config=config) as client:
            client.pipe("/secret.bin", data, layout=LayoutSpec(chunk_size=SMALL))
            assert client.cat("/secret.bin") == data
    finally:
        c.stop()


def test_stager_up_tls_with_auth(tmp_path: Path, payload) -> None:
    """``stager up --tls --auth``: the join token is minted over https, and a user's
    token works through ``stager --ca … --token-file …``."""
    data = payload(SMALL + 1)
    local = tmp_path / "local.bin"
    local.write_bytes(data)
    with ProcessCluster(tmp_path / "up", 2, tls=True, auth=True) as c:
        assert c.info["auth"] is True and c.meta_url.startswith("https://")
        token = tmp_path / "user.token"
        token.write_text(c.mint(["read", "write"]) + "\n")
        flags = ("--ca", c.ca_file, "--token-file", str(token))
        stager(*flags, "put", str(local), "/y.bin", meta=c.meta_url)
        assert stager(*flags, "cat", "/y.bin", meta=c.meta_url).stdout == data
