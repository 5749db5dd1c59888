"""Trust between servers (issue 26, finding 1): a data server proves who it is.

Real auth-on clusters (``ThreadCluster``), real data servers keeping their
credentials on disk, a real TLS cluster with its own CA, and a rogue HTTPS server
with a certificate of another CA.  What the route matrix (test_auth_matrix.py)
says route by route, this says as stories: a join token of limited use, a
credential rotated by revoking it, a target forgotten, a rogue that cannot get in.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import start_cluster

from stager.auth.tls import ensure_cluster_tls
from stager.config import load_config
from stager.meta.service import MetaService
from stager.meta.shared import sync
from stager.meta.store.sqlite.store import SQLiteStore
from stager.protocol.models import TargetInfo
from stager.protocol.routes import route
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # stager processes and the CLI: not in make check

REPO = Path(__file__).resolve().parents[1]


def call(cluster: ThreadCluster, op: str, token: str, body: Any = None,
         **values: Any) -> tuple[int, dict[str, Any]]:
    """One JSON request to the metadata server: (status, answer)."""
    r = route(op)
    data = None if body is None and r.method == "GET" else json.dumps(body or {}).encode()
    req = urllib.request.Request(r.url(cluster.meta_url, **values), data=data,
                                 method=r.method,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=cluster.config.ca_file) \
        if cluster.config.ca_file else None
    try:
        with urllib.request.urlopen(req, timeout=15, context=context) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def stager(cluster: ThreadCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stager", "--meta", cluster.meta_url, *argv],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "STAGER_TOKEN": cluster.admin_token})


def targets(cluster: ThreadCluster) -> dict[str, dict[str, Any]]:
    _, answer = call(cluster, "list_targets", cluster.admin_token)
    return {t["id"]: t for t in answer["targets"]}


def credential_of(cluster: ThreadCluster, i: int) -> Path:
    server = cluster.data[i]
    assert server is not None
    return server.root / "target.credential"


def target_id_of(cluster: ThreadCluster, i: int) -> str:
    server = cluster.data[i]
    assert server is not None
    return str(json.loads((server.root / "target.json").read_text())["target_id"])


def wait_until(predicate: Any, timeout: float = 15, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fake(n: str, url: str = "") -> dict[str, str]:
    return {"id": f"fake-{n}", "node": f"fake-{n}", "url": url or f"http://127.0.0.1:9/{n}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("identity"), 3, auth=True, replicas=1,
                      target_lost_after=1.0)
    yield c
    c.stop()


def test_each_target_keeps_its_own_credential_and_speaks_only_with_it(
        cluster: ThreadCluster) -> None:
    names = {}
    for i in range(cluster.n):
        path = credential_of(cluster, i)
        # the target is listed up as soon as it registered; the file follows the answer
        wait_until(path.exists, what=f"{path}")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        names[target_id_of(cluster, i)] = path.read_text().strip()
    assert len(set(names.values())) == cluster.n           # one each
    _, listed = call(cluster, "list_tokens", cluster.admin_token)
    minted = {t["name"] for t in listed["tokens"] if t["scopes"] == ["target"]}
    assert {f"target:{t}" for t in names} <= minted
    t0, t1 = sorted(names)[:2]
    beat = {"capacity": 1 << 30, "used": 0, "chunks": 0}
    assert call(cluster, "heartbeat", names[t0], beat, target_id=t0)[0] == 200
    # the join token every node holds no longer heartbeats, and a target's credential
    # speaks for that target alone
    assert call(cluster, "heartbeat", cluster.join_token, beat, target_id=t0)[0] == 403
    assert call(cluster, "heartbeat", names[t1], beat, target_id=t0)[0] == 403
    assert call(cluster, "leave_target", names[t1], {}, target_id=t0)[0] == 403
    assert call(cluster, "scrub_report", names[t1], {"target": t0, "chunks": []})[0] == 403
    # nor does it read, write or administer anything
    assert call(cluster, "stat", names[t0], path="/")[0] == 403
    assert call(cluster, "create_token", names[t0], {"scopes": ["join"]})[0] == 403


def test_a_join_token_registers_as_many_new_targets_as_its_uses(
        cluster: ThreadCluster) -> None:
    made = stager(cluster, "token", "create", "--scope", "join", "--uses", "1",
                  "--name", "one node")
    assert made.returncode == 0, made.stderr
    assert "1 uses" in made.stdout
    join = made.stdout.strip().splitlines()[-1]
    status, first = call(cluster, "register_target", join, fake("uses-a"))
    assert status == 200 and first["credential"], first
    status, refused = call(cluster, "register_target", join, fake("uses-b"))
    assert status == 403 and "no registrations left" in refused["message"], refused
    # the target it did register comes back with its own credential: no use spent
    again = call(cluster, "register_target", first["credential"], fake("uses-a"))
    assert again[0] == 200 and again[1]["credential"] is None
    listing = stager(cluster, "token", "list")
    assert "0 uses left" in next(line for line in listing.stdout.splitlines()
                                 if "one node" in line)
    # `--uses` limits join tokens alone, and target credentials are not for minting
    for argv in (["--scope", "read", "--uses", "2"], ["--scope", "join", "--uses", "0"],
                 ["--scope", "target"]):
        bad = stager(cluster, "token", "create", *argv)
        assert bad.returncode != 0 and bad.stdout == "", (argv, bad.stdout)
    for t in ("fake-uses-a",):
        call(cluster, "remove_target", cluster.admin_token, {}, target_id=t)


def test_a_revoked_credential_is_replaced_at_the_next_registration(
        cluster: ThreadCluster) -> None:
    """Rotation: the operator revokes a target's credential; its data server is refused,
    drops the file, registers again with its join token at the URL it has, and keeps the
    new credential.  The old one is refused from then on."""
    path = credential_of(cluster, 1)
    target = target_id_of(cluster, 1)
    old = path.read_text().strip()
    _, listed = call(cluster, "list_tokens", cluster.admin_token)
    old_id = next(t["id"] for t in listed["tokens"]
                  if t["name"] == f"target:{target}" and t["revoked"] is None)
    assert call(cluster, "revoke_token", cluster.admin_token, {}, token_id=old_id)[0] == 200
    wait_until(lambda: path.exists() and path.read_text().strip() not in ("", old),
               what="a new credential")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    beat = {"capacity": 1 << 30, "used": 0, "chunks": 0}
    assert call(cluster, "heartbeat", old, beat, target_id=target)[0] == 401
    wait_until(lambda: targets(cluster)[target]["state"] == "up", what="the target up")


def test_a_forgotten_target_leaves_the_listing_and_its_credential_is_revoked(
        cluster: ThreadCluster) -> None:
    spare = fake("forget")
    status, registered = call(cluster, "register_target", cluster.join_token, spare)
    assert status == 200
    refused = stager(cluster, "target", "forget", spare["id"])   # up: refused
    assert refused.returncode != 0 and "only a lost or removed" in refused.stderr
    assert call(cluster, "remove_target", cluster.admin_token, {},
                target_id=spare["id"])[0] == 200

    def forgotten() -> bool:
        done = stager(cluster, "target", "forget", spare["id"])
        return done.returncode == 0     # 409 while its (empty) rebuild runs

    wait_until(forgotten, what="the forget")
    assert spare["id"] not in targets(cluster)
    _, status_now = call(cluster, "status", cluster.admin_token)
    assert spare["id"] not in {t["id"] for t in status_now["targets"]}
    beat = {"capacity": 1, "used": 0, "chunks": 0}
    assert call(cluster, "heartbeat", registered["credential"], beat,
                target_id=spare["id"])[0] == 401               # revoked
    assert call(cluster, "forget_target", cluster.admin_token, {},
                target_id=spare["id"])[0] == 404


# -- a TLS cluster ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("identity-tls"), 2, auth=True, tls=True)
    yield c
    c.stop()


class Impostor:
    """An HTTPS server whose certificate another CA signed, answering health as ``id``."""

    def __init__(self, root: Path, target_id: str) -> None:
        files = ensure_cluster_tls(root)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(files.cert, files.key)
        self.target_id = target_id
        self.url = ""

    def __enter__(self) -> Impostor:
        ready = threading.Event()

        async def health(request: web.Request) -> web.Response:
            return web.json_response({"role": "data", "id": self.target_id})

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/v1/health", health)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self.context)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]
            self.url = f"https://127.0.0.1:{port}"
            ready.set()
            while not self.stopping:
                await asyncio.sleep(0.05)
            await runner.cleanup()

        self.stopping = False
        self.thread = threading.Thread(target=lambda: asyncio.run(main()),
                                       daemon=True)
        self.thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping = True
        self.thread.join(10)


def test_a_tls_cluster_takes_only_https_targets_whose_certificate_its_ca_signed(
        tls_cluster: ThreadCluster, tmp_path: Path) -> None:
    """Finding 1: a rogue registered ``http://127.0.0.1:7199`` in a ``--tls`` cluster."""
    join = tls_cluster.join_token
    status, answer = call(tls_cluster, "register_target", join,
                          fake("plain", "http://127.0.0.1:7199"))
    assert status == 400 and "https://" in answer["message"], answer
    with Impostor(tmp_path / "other-ca", "fake-impostor") as impostor:
        status, answer = call(tls_cluster, "register_target", join,
                              fake("impostor", impostor.url))
        assert status == 400 and "CA" in answer["message"], answer
    # a real data server's URL, claimed under another id: it answers as itself
    real = next(iter(targets(tls_cluster).values()))
    status, answer = call(tls_cluster, "register_target", join, fake("echo", real["url"]))
    assert status in (400, 409), answer
    assert "fake-plain" not in targets(tls_cluster)
    assert "fake-impostor" not in targets(tls_cluster)
    assert all(t["url"].startswith("https://") for t in targets(tls_cluster).values())


# -- a forgotten target leaves the other metadata servers too, and only that --------------
async def test_a_sync_drops_forgotten_targets_not_ones_registered_while_it_read(
        tmp_path: Path) -> None:
    """Servers sharing a store drop a target another server forgot.  A target that
    registered here while the list was being read is in the store, not in that list:
    it stays (once it was dropped, and writes found no target until its next
    heartbeat re-registered it: CI, ``no healthy storage targets``)."""
    now = [1000.0]
    svc = MetaService(SQLiteStore(tmp_path / "meta.sqlite3"), load_config({}, env={}),
                      clock=lambda: now[0])
    await svc.start()
    try:
        await svc.register_target(TargetInfo("old", "n0", "http://127.0.0.1:9/0"))
        stale = await svc.store.list_targets()          # read before "new" registers
        now[0] = 1001.0
        await svc.register_target(TargetInfo("new", "n1", "http://127.0.0.1:9/1"))
        await svc.store.forget_target("old")             # forgotten by another server
        stale = [t for t in stale if t.id != "old"]

        async def listed() -> list[TargetInfo]:
            return stale

        svc.store.list_targets = listed                  # type: ignore[method-assign]
        now[0] = 1000.5     # the list was read at 1000.5: after "old", before "new"
        await sync(svc)
        assert set(svc.targets) == {"new"}
    finally:
        svc.close()
