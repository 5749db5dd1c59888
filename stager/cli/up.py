"""``stager up``: a whole local cluster (metadata + N data servers) in the foreground.

Each server is its own process, so every core works.  Each data server gets its
own node name (``node0``, ``node1``, …) so replicas land on distinct "nodes"
even on one machine.  The endpoints go to ``ROOT/cluster.json``.  SIGINT or
SIGTERM stops every server cleanly; started again on the same root the cluster
comes back with every committed file.

With ``--meta-store postgresql://…`` the namespace lives in that database, and
``--meta-servers N`` starts N metadata servers on it (roots ``ROOT/meta``,
``ROOT/meta1``, …; one signing key under ``ROOT/auth``); ``cluster.json`` lists
them under ``"metas"`` and keeps the first as ``"meta"``.  The data servers
are given all of them (``--meta A,B``) and heartbeat to the first that answers.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, load_config, parse_size
from ..errors import StagerError
from .supervise import restart
from .upfork import Forked, fork_stager, wake_on_signals

# The client, the servers' pieces and TLS are imported where they are used: every
# `stager` command builds this module's parser, and most never start a cluster.

READY_TIMEOUT = 30.0
JOIN_TOKEN_FILE = "join.token"
S3GATEWAY_TOKEN_FILE = "s3gateway.token"    # --auth --s3-port: the gateway's own credential


@dataclass
class Server:
    role: str
    root: Path
    proc: subprocess.Popen[bytes] | Forked
    node: str = ""
    url: str = ""
    argv: list[str] = field(default_factory=list)
    log: Path | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"url": self.url, "pid": self.proc.pid, "root": str(self.root)}
        if self.role == "data":
            body["node"] = self.node
            body["target_id"] = _target_id(self.root)
        return body


def _target_id(root: Path) -> str:
    try:
        return str(json.loads((root / "target.json").read_text())["target_id"])
    except (OSError, ValueError, KeyError):
        return ""


def meta_list(metas: list[Server]) -> str:
    """What a client is given to find the cluster: every metadata server, comma-separated
    (it fails over from one to the next)."""
    return ",".join(m.url for m in metas)


def _die_with_parent() -> None:
    """Children get SIGTERM if `stager up` itself dies (even by SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _spawn(role: str, root: Path, argv: list[str], log: Path) -> Server:
    """Start ``stager ARGV``: forked from this process, its code already imported
    (stager/cli/upfork.py), else as a new ``python -m stager``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "server.json").unlink(missing_ok=True)
    forked = fork_stager(argv, log, data=role == "data")
    if forked is not None:
        return Server(role, root, forked, argv=argv, log=log)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stager", *argv], stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                start_new_session=True)
    return Server(role, root, proc, argv=argv, log=log)


def _wait_ready(server: Server, deadline: float) -> None:
    ready = server.root / "server.json"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.role} server exited with {server.proc.returncode}; "
                               f"see {server.root}/server.log")
        if ready.exists():
            server.url = json.loads(ready.read_text())["url"]
            return
        time.sleep(0.02)
    raise RuntimeError(f"{server.role} server at {server.root} not ready in time")


def _wait_targets(meta_url: str, want: int, deadline: float, token: str | None,
                  ca_file: str = "") -> None:
    from ..auth.tls import client_context
    from ..protocol.messages import TargetList
    from ..protocol.routes import route

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = client_context(ca_file) if ca_file else None
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(route("list_targets").url(meta_url), headers=headers)
            with urllib.request.urlopen(req, timeout=2, context=context) as resp:
                targets = TargetList.from_json(json.load(resp)).targets
            if sum(t.up for t in targets) >= want:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"fewer than {want} data servers registered in time")


def start_cluster(args: argparse.Namespace, started: list[Server]
                  ) -> tuple[list[Server], list[Server]]:
    """Start every server; each is added to ``started`` as soon as it is spawned.
    Returns the metadata servers and the data servers."""
    from ..meta.auth import ADMIN_TOKEN_FILE, AUTH_DIR

    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + READY_TIMEOUT
    tls, ca = _tls_argv(args)
    exposure = ["--auth"] if args.auth else ["--insecure"] if args.insecure else []
    metas = []
    for i in range(args.meta_servers):
        # The first on --port; the others on ports of their own (kept by --restart).
        port = args.port if i == 0 else 0
        mroot = root / ("meta" if i == 0 else f"meta{i}")
        meta_argv = [*ca, "meta", "--root", str(mroot), "--host", args.host,
                     "--port", str(port), "--replicas", str(args.replicas), *tls]
        if args.chunk_size:
            meta_argv += ["--chunk-size", args.chunk_size]
        if args.cache_limit:
            meta_argv += ["--cache-limit", args.cache_limit]
        if args.meta_store:
            meta_argv += ["--store", args.meta_store]
        # One auth directory for them all, also without --auth: it holds the key that
        # seals attached sources' storage options, which every server must open.
        meta_argv += ["--auth-dir", str(root / AUTH_DIR)]
        if args.auth:
            meta_argv += ["--admin-token-file", str(root / ADMIN_TOKEN_FILE)]
        server = _spawn("meta", mroot, meta_argv + exposure, mroot / "server.log")
        started.append(server)
        metas.append(server)
        # One at a time: the first makes the schema, the signing key and the admin token.
        _wait_ready(server, deadline)
    meta = metas[0]
    admin = (root / ADMIN_TOKEN_FILE).read_text().strip() if args.auth else None
    join = ["--token-file", str(_join_token(root, meta.url, admin, args.ca_file))] \
        if admin else []
    data = []
    for i in range(args.data_servers):
        droot = root / f"data{i}"
        urls = meta_list(metas)
        argv = [*join, *ca, "--meta", urls, "data", "--root", str(droot), "--host",
                args.host, "--port", "0", "--node", f"node{i}", *exposure, *tls]
        server = _spawn("data", droot, argv, droot / "server.log")
        server.node = f"node{i}"
        data.append(server)
        started.insert(0, server)
    for server in data:
        _wait_ready(server, deadline)
    _wait_targets(meta.url, args.data_servers, deadline, admin, args.ca_file)
    if args.s3_port is not None:
        started.append(_start_s3(args, root, metas, ca, tls, exposure, deadline))
    return metas, data


def _start_s3(args: argparse.Namespace, root: Path, metas: list[Server], ca: list[str],
              tls: list[str], exposure: list[str], deadline: float) -> Server:
    """``--s3-port``: an S3 gateway (``stager s3``) over the cluster, as a client of it."""
    from ..meta.auth import ADMIN_TOKEN_FILE, AUTH_DIR

    s3root = root / "s3"
    # with --auth: its own credential, which only asks whether S3 signatures are good
    cred = ["--token-file", str(_machine_token(
        root / AUTH_DIR / S3GATEWAY_TOKEN_FILE, "s3gateway", "stager up s3 gateway", metas[0].url,
        (root / ADMIN_TOKEN_FILE).read_text().strip(), args.ca_file))] if args.auth else []
    argv = [*cred, *ca, "--meta", meta_list(metas), "s3", "--host", args.host, "--port",
            str(args.s3_port), "--ready-file", str(s3root / "server.json"), *exposure, *tls]
    server = _spawn("s3", s3root, argv, s3root / "server.log")
    _wait_ready(server, deadline)
    return server


def _join_token(root: Path, meta_url: str, admin: str, ca_file: str = "") -> Path:
    """``ROOT/auth/join.token`` (0600), minted the first time: the data servers'
    credential to register and heartbeat."""
    from ..meta.auth import AUTH_DIR

    return _machine_token(root / AUTH_DIR / JOIN_TOKEN_FILE, "join", "stager up data servers",
                          meta_url, admin, ca_file)


def _machine_token(path: Path, scope: str, name: str, meta_url: str, admin: str | None,
                   ca_file: str = "") -> Path:
    """``path`` (0600): a token of ``scope`` alone on ``/``, minted the first time."""
    from ..auth.keys import write_secret
    from ..client import AsyncClient
    from ..protocol.authmsg import MAX_TTL

    if not path.exists():
        async def mint() -> str:
            config = load_config({"ca_file": ca_file or None})
            async with AsyncClient(meta_url, config=config, token=admin) as client:
                made = await client.create_token([scope], ["/"], MAX_TTL, name)
                return made.token
        write_secret(path, asyncio.run(mint()) + "\n")
    return path


def _tls_argv(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The servers' TLS flags and the global ``--ca`` they trust each other with:
    ``--tls`` makes a private CA and a certificate under ``ROOT/tls/`` (once);
    ``--tls-cert/--tls-key`` name the operator's own (trusted through ``--ca`` or
    ``STAGER_CA_FILE``, else the system's store)."""
    from ..auth.tls import ensure_cluster_tls, tls_pair

    if args.tls:
        files = ensure_cluster_tls(Path(args.root).resolve() / "tls", [args.host])
        args.ca_file = str(files.ca_cert)
        return ["--tls-cert", str(files.cert), "--tls-key", str(files.key)], \
            ["--ca", args.ca_file]
    try:
        pair = tls_pair(args.tls_cert or "", args.tls_key or "")
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
    if pair is None:
        return [], []
    args.ca_file = os.environ.get("STAGER_CA_FILE", "")
    return ["--tls-cert", pair[0], "--tls-key", pair[1]], \
        (["--ca", args.ca_file] if args.ca_file else [])


def stop_servers(servers: list[Server], timeout: float = 10.0) -> None:
    for s in servers:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for s in servers:
        try:
            s.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()


def run_up(args: argparse.Namespace) -> int:
    from ..meta.auth import ADMIN_TOKEN_FILE
    from ..web.server import refuse_exposed, write_json_atomic

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    idle = wake_on_signals()
    root = Path(args.root)
    servers: list[Server] = []
    try:
        refuse_exposed(Config(host=args.host, auth=args.auth, insecure=args.insecure))
        if args.meta_servers < 1:
            raise RuntimeError("--meta-servers must be 1 or more")
        if args.cache_limit:
            parse_size(args.cache_limit)        # said here, not in a server's log
        if args.meta_servers > 1 and not args.meta_store:
            raise RuntimeError("--meta-servers above 1 needs --meta-store postgresql://… "
                               "(SQLite serves one metadata server)")
        metas, data = start_cluster(args, servers)
        meta = metas[0]
        cluster = {"meta": meta.to_json(), "metas": [m.to_json() for m in metas],
                   "data": [d.to_json() for d in data],
                   "pid": os.getpid(), "replicas": args.replicas, "auth": bool(args.auth)}
        if args.ca_file:
            cluster["ca_file"] = args.ca_file
        s3 = next((s for s in servers if s.role == "s3"), None)
        if s3 is not None:
            cluster["s3_url"], cluster["s3"] = s3.url, s3.to_json()
        if args.auth:
            cluster["admin_token_file"] = str(root / ADMIN_TOKEN_FILE)
        write_json_atomic(root / "cluster.json", cluster)
        print(f"stager cluster up: metadata server {meta.url}", flush=True)
        print(f"  dashboard {meta.url}/ui/", flush=True)
        for other in metas[1:]:
            print(f"  metadata server {other.url}", flush=True)
        print(f"  clients: --meta {meta_list(metas)}  (or STAGER_META_URL={meta_list(metas)})",
              flush=True)
        for d in data:
            print(f"  data server {d.url}  node {d.node}  target {_target_id(d.root)}",
                  flush=True)
        if s3 is not None:
            print(f"  S3 endpoint {s3.url}  (docs/s3.md)", flush=True)
        if args.auth:
            print(f"auth on: admin token in {root / ADMIN_TOKEN_FILE} "
                  f"(stager --token-file {root / ADMIN_TOKEN_FILE} ...)", flush=True)
        if args.ca_file:
            print(f"clients trust the CA {args.ca_file} (--ca or STAGER_CA_FILE)", flush=True)
        print(f"endpoints written to {root / 'cluster.json'}; Ctrl-C stops", flush=True)
        while not stopping:
            for s in servers:
                if s.proc.poll() is not None:
                    print(f"stager up: {s.role} server {s.url} exited with "
                          f"{s.proc.returncode}", file=sys.stderr, flush=True)
                    if args.restart:
                        _restart(s, servers, cluster, root)
                        break
                    servers.remove(s)
                    if s.role == "meta" and not any(o.role == "meta" for o in servers):
                        return 1        # the last metadata server: the cluster is gone
                    break
            idle(0.2)
        return 0
    except (RuntimeError, StagerError) as exc:
        print(f"stager up: {exc}", file=sys.stderr)
        return 1
    finally:
        # Only servers we started; the data servers first so no heartbeat fails noisily.
        stop_servers(servers)
        (root / "cluster.json").unlink(missing_ok=True)


def _restart(old: Server, servers: list[Server], cluster: dict[str, Any], root: Path) -> None:
    """``--restart``: start ``old`` again (same root and port), update cluster.json."""
    from ..web.server import write_json_atomic

    try:
        new = restart(old, _spawn, _wait_ready)
    except RuntimeError as exc:
        print(f"stager up: restarting the {old.role} server failed: {exc}; will retry",
              file=sys.stderr, flush=True)
        time.sleep(1.0)
        return
    servers[servers.index(old)] = new
    if new.role == "meta":
        cluster["metas"] = [new.to_json() if m["root"] == str(new.root) else m
                            for m in cluster["metas"]]
        cluster["meta"] = cluster["metas"][0]
    elif new.role == "s3":
        cluster["s3_url"], cluster["s3"] = new.url, new.to_json()
    else:
        cluster["data"] = [new.to_json() if d["root"] == str(new.root) else d
                           for d in cluster["data"]]
    cluster["restarts"] = cluster.get("restarts", 0) + 1
    # said before cluster.json shows it: whoever reads the count finds the line logged
    print(f"stager up: {new.role} server restarted at {new.url} (pid {new.proc.pid})",
          flush=True)
    write_json_atomic(root / "cluster.json", cluster)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="run a whole local cluster in the foreground")
    p.add_argument("--root", default=".stager", help="state directory (default: ./.stager)")
    p.add_argument("--data-servers", type=int, default=4, help="data servers (default: 4)")
    p.add_argument("--port", type=int, default=7070,
                   help="metadata server port (default: 7070; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--replicas", type=int, default=1, help="default replicas (default: 1)")
    p.add_argument("--chunk-size", help="default chunk size (default: 4MiB)")
    p.add_argument("--cache-limit", metavar="BYTES",
                   help="keep the bytes filled into attached directories under this "
                        "(e.g. 2GiB; default: no limit; docs/cache.md)")
    p.add_argument("--meta-store", metavar="URL",
                   help="the metadata servers' store: postgresql://USER@HOST:PORT/DB "
                        "(default: SQLite under ROOT/meta)")
    p.add_argument("--meta-servers", type=int, default=1,
                   help="metadata servers sharing --meta-store (default: 1)")
    p.add_argument("--auth", action="store_true",
                   help="require tokens: a signing key under ROOT/auth/, an admin token in "
                        "ROOT/admin.token (both mode 0600)")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without --auth")
    p.add_argument("--s3-port", type=int, metavar="PORT",
                   help="also run an S3 gateway (stager s3) on PORT (0 picks a free one); "
                        "its URL goes to cluster.json's s3_url (docs/s3.md)")
    p.add_argument("--restart", action="store_true",
                   help="start a server that exits (crash, kill -9) again, same root and port")
    p.add_argument("--tls", action="store_true",
                   help="HTTPS everywhere: a private CA and server certificate under "
                        "ROOT/tls/ (made once), its CA in cluster.json's ca_file")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate "
                                                     "(instead of --tls); needs --tls-key")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.set_defaults(func=run_up, ca_file="")    # ca_file: set by _tls_argv
