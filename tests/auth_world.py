"""The auth matrix's world and its cases: one request builder per route (issue 18).

:class:`World` is an auth-on cluster with what the cases need: tokens of every
scope on ``/`` and on two prefixes (``/m``, where the files are, and ``/other``),
two committed files and two open uploads under ``/m``, and capabilities for them
(read ones from a stat, write ones from a create, as a client gets them; the rest
signed with the cluster's own key, read from ``ROOT/meta/auth/signing.key``).

:data:`CASES` maps every operation of :data:`~stager.protocol.routes.ROUTES` to a
:class:`Case`: how to build a fresh request (making first whatever it acts on),
the credential that is right for it, and where they apply the one with the wrong
scope and the one with the right scope on the wrong prefix (a data server: the
wrong file).  Credentials are names: a token (metadata server) or a capability
(data servers) of :attr:`World.creds`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conftest import Reply, raw_http
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager.auth import KEY_FILE, Capability, Token, load_key, sign, sigv4
from stager.auth.tokens import ANY_FILE, CLUSTER
from stager.checksum import crc32c, to_hex
from stager.errors import InsufficientStorage
from stager.meta.multipart import hidden_part_id
from stager.plans.registered import plan_id
from stager.protocol import headers as H
from stager.protocol.authmsg import TokenRequest
from stager.protocol.batch import ChunkItem, CommitItem, CreateItem, chunk_batch_head
from stager.protocol.manifest import Manifest, ManifestFile
from stager.protocol.messages import MkdirRequest
from stager.protocol.models import LayoutSpec
from stager.protocol.routes import route
from stager.testing import ThreadCluster

SELF_ID = "0" * 32              # the holder of the metadata server's own capability
TOKENS = {                      # name: (scopes, prefixes), minted by the admin
    "read": (["read"], ("/",)), "write": (["write"], ("/",)),
    "read_m": (["read"], ("/m",)), "write_m": (["write"], ("/m",)),
    "read_o": (["read"], ("/other",)), "write_o": (["write"], ("/other",)),
    "admin_o": (["admin"], ("/other",)), "join_o": (["join"], ("/other",)),
    "loader_m": (["read", "telemetry"], ("/m",)),       # a Loader's: it reads and reports
    # an S3 gateway's own credential (it asks whether S3 signatures are good, nothing else)
    "s3gateway": (["s3gateway"], ("/",)), "s3gateway_o": (["s3gateway"], ("/other",)),
}
FILE_A, FILE_B = b"A" * 5000, b"B" * 3000


@dataclass
class Sent:
    """One request, ready to send (its credential is added by whoever sends it)."""

    method: str
    target: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def as_json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def post(op: str, body: Any, **values: Any) -> Sent:
    r = route(op)
    return Sent(r.method, r.target(**values), as_json(body),
                {"Content-Type": "application/json"})


def get(op: str, **values: Any) -> Sent:
    r = route(op)
    return Sent(r.method, r.target(**values))


class World:
    """An auth-on cluster, its tokens, files, uploads and capabilities."""

    def __init__(self, cluster: ThreadCluster) -> None:
        self.cluster = cluster
        # a source directory to attach (outside the metadata server's root: refused there)
        source = cluster.root / "attach-source"
        source.mkdir(exist_ok=True)
        (source / "s.bin").write_bytes(b"s" * 1000)
        self.source = f"file://{source}"
        self.urls = {"meta": cluster.meta_url, "data": cluster.data[0].url}  # type: ignore[union-attr]
        self.key = load_key(cluster.root / "meta" / "auth" / KEY_FILE)
        self.fresh = itertools.count()
        self.fakes: list[str] = []          # fake targets to remove after each test
        self.creds: dict[str, str] = {"admin": cluster.admin_token, "join": cluster.join_token}
        for name, (scopes, prefixes) in TOKENS.items():
            self.creds[name] = cluster.mint(scopes, prefixes, name=name)
        self.a = self.admin("PUT", route("gateway_put").target(
            path="/m/a", query={"replicas": 3}), FILE_A).json()["file_id"]
        self.b = self.admin("PUT", route("gateway_put").target(
            path="/m/b", query={"replicas": 3}), FILE_B).json()["file_id"]
        self.u = self.upload("/m/u", "write_m")
        self.v = self.upload("/m/v", "write_m")
        manifest = Manifest("/m", (ManifestFile("a", len(FILE_A), 0.0, self.a),))
        self.admin("PUT", route("put_manifest").target(path="/m"), as_json(manifest.to_json()))
        self.targets = self.admin("GET", route("list_targets").target()).json()["targets"]
        here = next(t["id"] for t in self.targets if t["url"] == self.urls["data"])
        other = next(t["id"] for t in self.targets if t["id"] != here)
        self.here, self.other = here, other     # the data server the cases talk to; another
        self.creds |= {     # capabilities, for the data server
            "read_a": self.stat("/m/a", "read_m")["capability"],
            "read_b": self.stat("/m/b", "read_m")["capability"],
            "write_u": self.u["capability"], "write_v": self.v["capability"],
            "read_u": self.cap(self.u["file_id"], "read"),
            "cluster": self.cap(ANY_FILE, CLUSTER, holder=SELF_ID, target=here),
            # the metadata server's own, for another target: what a rogue target got
            "cluster_other": self.cap(ANY_FILE, CLUSTER, holder=SELF_ID, target=other),
        }
        # target credentials, each kept by its data server (ROOT/target.credential)
        self.credentials = {t["id"]: self.target_credential(t["id"]) for t in self.targets}
        self.creds |= {"target": self.credentials[self.targets[0]["id"]],
                       "target_other": self.credentials[self.targets[1]["id"]]}

    # -- credentials ---------------------------------------------------------------------
    def cap(self, file_id: str, op: str, *, holder: str = "1" * 32, ttl: float = 600,
            key: Ed25519PrivateKey | None = None, now: float | None = None,
            target: str | None = None) -> str:
        """A capability signed with the cluster's key (or ``key``)."""
        claims = Capability.new(file_id, op, holder, time.time() if now is None else now, ttl,
                                target)
        return sign(key or self.key, claims)

    def target_credential(self, target_id: str) -> str:
        """The credential the data server of ``target_id`` keeps under its root (written
        once the registration's answer came back: a moment after the target is up)."""
        for server in self.cluster.data:
            assert server is not None
            if json.loads((server.root / "target.json").read_text())["target_id"] == target_id:
                path = server.root / "target.credential"
                deadline = time.monotonic() + 15
                while not path.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                return path.read_text().strip()
        raise KeyError(target_id)

    def token(self, scopes: list[str], *, key: Ed25519PrivateKey | None = None,
              ttl: float = 3600, now: float | None = None) -> str:
        """A token signed with the cluster's key (or ``key``) but never recorded."""
        claims = Token.new("made", scopes, ["/"], ttl, time.time() if now is None else now)
        return sign(key or self.key, claims)

    def headers(self, role: str, cred: str | None) -> dict[str, str]:
        """The header carrying the credential named ``cred`` (or ``cred``'s text when it
        is no name) to a server of ``role``."""
        if cred is None:
            return {}
        text = self.creds.get(cred, cred)
        if role == "data":
            return {H.CAPABILITY: text}
        return {H.AUTHORIZATION: f"Bearer {text}"}

    # -- requests --------------------------------------------------------------------------
    def send(self, role: str, sent: Sent, cred: str | None = None,
             extra: dict[str, str] | None = None) -> Reply:
        headers = {**sent.headers, **self.headers(role, cred), **(extra or {})}
        return raw_http(self.urls[role], sent.method, sent.target, sent.body, headers)

    def admin(self, method: str, target: str, body: bytes | None = None,
              cred: str = "admin") -> Reply:
        reply = self.send("meta", Sent(method, target, body), cred)
        assert reply.status < 300, (method, target, reply.status, reply.body[:300])
        return reply

    def name(self, stem: str) -> str:
        return f"/m/{stem}-{next(self.fresh)}"

    def mkdir(self, stem: str) -> str:
        path = self.name(stem)
        self.admin("POST", route("mkdir").target(), as_json(MkdirRequest(path).to_json()))
        return path

    def upload(self, path: str, cred: str = "admin") -> dict[str, Any]:
        """A create of ``path`` (a batch of one): its one result, the upload."""
        body = as_json({"items": [CreateItem(path).to_json()]})
        [made] = self.admin("POST", route("create").target(), body, cred).json()["results"]
        return dict(made)

    def stat(self, path: str, cred: str) -> dict[str, Any]:
        return dict(self.admin("GET", route("stat").target(path=path), cred=cred).json())

    def attach(self) -> str:
        """A new attached directory under ``/m`` (of :attr:`source`)."""
        path = self.name("at")
        self.admin("PUT", route("attach").target(path=path), as_json({"source": self.source}))
        return path

    def cached_file(self) -> str:
        """The file id of a file of a new attached directory."""
        return str(self.stat(f"{self.attach()}/s.bin", "read_m")["file_id"])

    def plan_body(self) -> tuple[bytes, dict[str, str]]:
        """A plan registration over a file of a new attached directory."""
        dataset = {"files": [self.cached_file()], "chunk_sizes": [4 << 20], "samples": 1,
                   "sample": [0], "file": [0], "offset": [0], "length": [1000]}
        body = {"plan": {"seed": 1, "epoch": 0, "world_size": 1, "batch_size": 1,
                         "window": 1}, "dataset": dataset, "epoch": 0, "cursor": 0}
        return as_json(body), {"Content-Type": "application/json"}

    def fake_target(self) -> str:
        """A registered target no server serves (its credential in :attr:`creds` as
        ``fake``); removed again by :meth:`tidy`."""
        sent = self.new_target()
        reply = self.admin(sent.method, sent.target, sent.body, cred="join")
        target_id = json.loads(sent.body or b"{}")["id"]
        self.creds["fake"] = reply.json()["credential"]     # the newest fake's own
        return target_id

    def new_target(self) -> Sent:
        """A registration of a target id never seen (removed by :meth:`tidy` once sent)."""
        n = next(self.fresh)
        self.fakes.append(f"fake-{n}")
        return post("register_target", {"id": f"fake-{n}", "node": f"fake-{n}",
                                        "url": f"http://127.0.0.1:9/{n}"})

    def tidy(self) -> None:
        """Remove the fake targets (those registered), so no layout names them."""
        while self.fakes:
            target_id = self.fakes.pop()
            reply = self.send("meta", post("remove_target", {}, target_id=target_id), "admin")
            assert reply.status in (200, 404), reply.body[:300]


@dataclass(frozen=True)
class Case:
    build: Callable[[World], Sent]
    right: str | None = None            # None: a public route
    ok: tuple[int, ...] = (200,)
    scope: str | None = None            # the right prefix or file, the wrong scope
    prefix: str | None = None           # the right scope, the wrong prefix or file


def _chunk_put(w: World) -> Sent:
    data = b"u" * 1000
    chunk = f"{w.u['file_id']}.{next(w.fresh)}"
    return Sent("PUT", route("put_chunk").target(chunk=chunk), data,
                {H.CRC32C: to_hex(crc32c(data))})


def _chunk_batch(w: World) -> Sent:
    data = b"w" * 700
    item = ChunkItem(f"{w.u['file_id']}.{next(w.fresh)}", len(data), crc32c(data))
    return Sent("POST", route("batch_write").target(), chunk_batch_head([item]) + data)


def _commit(w: World) -> Sent:
    return post("commit", {"items": [CommitItem(w.upload(w.name("c"))["file_id"], 0,
                                                ()).to_json()]})


def _reroute(w: World) -> Sent:
    file_id = w.upload(w.name("rr"))["file_id"]
    return post("reroute", {"target": "no-such-target", "code": InsufficientStorage.code,
                            "items": [{"file_id": file_id, "chunks": 0}]})


def _revoke(w: World) -> Sent:
    body = as_json(TokenRequest(("read",), ("/m",), 60, "to revoke").to_json())
    token_id = w.admin("POST", route("create_token").target(), body).json()["info"]["id"]
    return post("revoke_token", {}, token_id=token_id)


def _unpin(w: World) -> Sent:
    path = w.mkdir("up")
    w.admin("PUT", route("pin").target(path=path), as_json({}))
    return get("unpin", path=path)


def _plan_position(w: World) -> Sent:
    """A position of a plan ``read_m`` registered (the one token it answers)."""
    pid = plan_id(next(w.fresh))
    body, headers = w.plan_body()
    w.admin("PUT", route("register_plan").target(plan_id=pid), body, cred="read_m")
    return post("plan_position", {"epoch": 0, "cursor": 1}, plan_id=pid)


def _heartbeat(w: World) -> Sent:
    t = w.targets[0]        # its own figures: the next real heartbeat says the same
    return post("heartbeat", {"capacity": t["capacity"], "used": t["used"],
                              "chunks": t["chunks"]}, target_id=t["id"])


def _forget(w: World) -> Sent:
    """A removed fake target (no chunks: its rebuild has nothing to copy)."""
    target_id = w.fake_target()
    w.admin("POST", route("remove_target").target(target_id=target_id))
    return post("forget_target", {}, target_id=target_id)


def _verify_s3(w: World) -> Sent:
    """A gateway's question about a request signed, today, with a key minted for it."""
    made = w.admin("POST", route("s3key_create").target(), as_json(TokenRequest(
        ("read",), ("/m",), 600, "s3 key").to_json())).json()
    now = time.gmtime()
    scope = sigv4.Scope(time.strftime("%Y%m%d", now), "us-east-1", "s3")
    text = "\n".join(("AWS4-HMAC-SHA256", time.strftime("%Y%m%dT%H%M%SZ", now), scope.text,
                      "0" * 64))
    signature = sigv4.sign(sigv4.signing_key(made["secret_key"], scope), text)
    return post("s3key_verify", {"access_key": made["access_key"], "scope": scope.text,
                              "string_to_sign": text, "signature": signature})


def _multipart(w: World, *, part: bool = False) -> str:
    """A new multipart upload under ``/m`` (with an empty part 1 when ``part``)."""
    uid = str(w.admin("POST", route("multipart_create").target(),
                      as_json({"path": w.name("mp")})).json()["upload_id"])
    if part:
        w.admin("PUT", route("multipart_part_done").target(upload_id=uid, number=1),
                as_json(_empty_part(uid)))
    return uid


def _empty_part(uid: str) -> dict[str, Any]:
    return {"file_id": hidden_part_id(uid, 1), "first_chunk": 0, "size": 0,
            "md5": hashlib.md5(b"").hexdigest(), "checksums": []}


READ_M = {"right": "read_m", "scope": "write_m", "prefix": "read_o"}
WRITE_M = {"right": "write_m", "scope": "read_m", "prefix": "write_o"}
ADMIN = {"right": "admin", "scope": "write", "prefix": "admin_o"}
JOIN = {"right": "join", "scope": "write", "prefix": "join_o"}
# a target's own credential; a join token is the wrong scope, another target's the wrong one
TARGET = {"right": "target", "scope": "join", "prefix": "target_other"}
CLUSTER_CAP = {"right": "cluster", "scope": "write_u", "prefix": "cluster_other"}

CASES: dict[str, Case] = {
    # every server: public
    "health": Case(lambda w: get("health")),
    "openapi": Case(lambda w: get("openapi")),
    "metrics": Case(lambda w: get("metrics")),
    "auth_key": Case(lambda w: get("auth_key")),
    "dashboard": Case(lambda w: get("dashboard", asset="")),
    # metadata server: cluster
    "status": Case(lambda w: get("status"), "read_m"),
    "list_targets": Case(lambda w: get("list_targets"), "read_m"),
    "register_target": Case(lambda w: w.new_target(), **JOIN),
    "heartbeat": Case(_heartbeat, **TARGET),
    "leave_target": Case(lambda w: post("leave_target", {}, target_id=w.fake_target()),
                         "fake", scope="join", prefix="target_other"),
    "remove_target": Case(lambda w: post("remove_target", {}, target_id=w.fake_target()),
                          **ADMIN),
    # a removed target's rebuild may still be running: then 409, said so
    "forget_target": Case(_forget, ok=(200, 409), **ADMIN),
    "scrub": Case(lambda w: post("scrub", {}), **ADMIN),
    "scrub_report": Case(lambda w: post("scrub_report", {"target": w.targets[0]["id"],
                                                         "chunks": []}), **TARGET),
    "fsck": Case(lambda w: post("fsck", {"repair": False}), **ADMIN),
    "report_rank": Case(lambda w: Sent("PUT", route("report_rank").target(
        job=f"j-{next(w.fresh)}", rank=0), as_json({"interval": 1, "world_size": 1,
                                                     "samples": 0, "dataset": "/m"})),
        "loader_m", scope="read_m", prefix="write_o"),
    "list_jobs": Case(lambda w: get("list_jobs"), "read_m", scope="write"),
    # metadata server: namespace
    "stat": Case(lambda w: get("stat", path="/m/a"), **READ_M),
    "list": Case(lambda w: get("list", path="/m"), **READ_M),
    "mkdir": Case(lambda w: post("mkdir", {"path": w.name("d")}), **WRITE_M),
    "set_layout": Case(lambda w: post("set_layout", {
        "path": w.mkdir("l"), "layout": LayoutSpec(replicas=1).to_json()}), **WRITE_M),
    "create": Case(lambda w: post("create", {"items": [CreateItem(w.name("n")).to_json()]}),
                   **WRITE_M),
    "commit": Case(_commit, **WRITE_M),
    "abort": Case(lambda w: post("abort", {"file_ids": [w.upload(w.name("ab"))["file_id"]]}),
                  **WRITE_M),
    "reroute": Case(_reroute, **WRITE_M),
    "rename": Case(lambda w: post("rename", {"src": (src := w.mkdir("r")),
                                             "dst": src + "-moved"}), **WRITE_M),
    "remove": Case(lambda w: post("remove", {"path": w.mkdir("x")}), **WRITE_M),
    "put_manifest": Case(lambda w: Sent("PUT", route("put_manifest").target(path="/m"), as_json(
        Manifest("/m", (ManifestFile("a", len(FILE_A), 0.0, w.a),)).to_json())), **WRITE_M),
    "get_manifest": Case(lambda w: get("get_manifest", path="/m"), **READ_M),
    "gateway_get": Case(lambda w: get("gateway_get", path="/m/a"), **READ_M),
    "gateway_head": Case(lambda w: get("gateway_head", path="/m/a"), **READ_M),
    "gateway_put": Case(lambda w: Sent("PUT", route("gateway_put").target(path=w.name("p")),
                                       b"p" * 100), ok=(201,), **WRITE_M),
    "gateway_delete": Case(lambda w: get("gateway_delete", path=w.mkdir("g")), **WRITE_M),
    # metadata server: quotas and pins
    "list_quotas": Case(lambda w: get("list_quotas"), "read_m", scope="write"),
    "set_quota": Case(lambda w: Sent("PUT", route("set_quota").target(path=w.mkdir("q")),
                                     as_json({"bytes": 1 << 30})), **ADMIN),
    "list_pins": Case(lambda w: get("list_pins"), "read_m", scope="write"),
    "pin": Case(lambda w: Sent("PUT", route("pin").target(path=w.mkdir("pn")),
                               as_json({"ttl": 60})), **WRITE_M),
    "unpin": Case(_unpin, **WRITE_M),
    # metadata server: S3 multipart uploads (the handler checks the upload's path)
    "multipart_create": Case(lambda w: post("multipart_create", {"path": w.name("mp")}),
                             **WRITE_M),
    "multipart_list": Case(lambda w: get("multipart_list"), "read_m", scope="write"),
    "multipart_parts": Case(lambda w: get("multipart_parts", upload_id=_multipart(w)),
                            **READ_M),
    "multipart_part_begin": Case(lambda w: post("multipart_part_begin", {"size": 10},
                                                upload_id=_multipart(w), number=1), **WRITE_M),
    "multipart_part_done": Case(lambda w: Sent("PUT", route("multipart_part_done").target(
        upload_id=(uid := _multipart(w)), number=1), as_json(_empty_part(uid))), **WRITE_M),
    "multipart_complete": Case(lambda w: post("multipart_complete", {
        "parts": [[1, hashlib.md5(b"").hexdigest()]]}, upload_id=_multipart(w, part=True)),
        **WRITE_M),
    "multipart_abort": Case(lambda w: get("multipart_abort", upload_id=_multipart(w)),
                            **WRITE_M),
    # metadata server: attached directories
    "list_attachments": Case(lambda w: get("list_attachments"), "read_m", scope="write"),
    "attach": Case(lambda w: Sent("PUT", route("attach").target(path=w.name("at")),
                                  as_json({"source": w.source})), **ADMIN),
    "refresh_attachment": Case(lambda w: post("refresh_attachment", {}, path=w.attach()),
                               **WRITE_M),
    "detach": Case(lambda w: get("detach", path=w.attach()), **ADMIN),
    "fill": Case(lambda w: post("fill", {"items": [{"file_id": w.cached_file(), "chunks": [0]}]}),
                 **READ_M),
    "cache_reads": Case(lambda w: post("cache_reads", {"items": [
        {"file_id": w.cached_file(), "chunks": [0]}]}), **READ_M),
    "register_plan": Case(lambda w: Sent("PUT", route("register_plan").target(
        plan_id=plan_id(next(w.fresh))), *w.plan_body()), **READ_M),
    "plan_position": Case(_plan_position, **READ_M),
    # metadata server: tokens and capabilities
    "create_token": Case(lambda w: post("create_token", TokenRequest(
        ("read",), ("/m",), 60, "made").to_json()), **ADMIN),
    "list_tokens": Case(lambda w: get("list_tokens"), **ADMIN),
    "revoke_token": Case(_revoke, **ADMIN),
    "capabilities": Case(lambda w: post("capabilities", {"op": "read", "file_ids": [w.a]}),
                         **READ_M),
    # metadata server: S3 keys; the gateway's question takes the gateway's credential
    "s3key_create": Case(lambda w: post("s3key_create", TokenRequest(
        ("read",), ("/m",), 60, "s3 made").to_json()), **ADMIN),
    "s3key_list": Case(lambda w: get("s3key_list"), **ADMIN),
    "s3key_verify": Case(_verify_s3, "s3gateway", scope="write", prefix="s3gateway_o"),
    # data servers: capabilities
    "put_chunk": Case(_chunk_put, "write_u", (201,), scope="read_u", prefix="write_v"),
    "get_chunk": Case(lambda w: get("get_chunk", chunk=f"{w.a}.0"), "read_a", prefix="read_b"),
    "head_chunk": Case(lambda w: get("head_chunk", chunk=f"{w.a}.0"), "read_a",
                       prefix="read_b"),
    "delete_chunk": Case(lambda w: get("delete_chunk", chunk=f"{w.u['file_id']}.99999"),
                         **CLUSTER_CAP),
    "batch_write": Case(_chunk_batch, "write_u", (201,), scope="read_u", prefix="write_v"),
    "batch_read": Case(lambda w: post("batch_read", {"items": [[f"{w.a}.0", 0, 10]]}),
                       "read_a", prefix="read_b"),
    "purge": Case(lambda w: post("purge", {"file_ids": ["f" * 32]}), **CLUSTER_CAP),
    "list_chunks": Case(lambda w: get("list_chunks"), **CLUSTER_CAP),
    "scrub_chunks": Case(lambda w: post("scrub_chunks", {}), **CLUSTER_CAP),
}
# batched heartbeats (issue 30): the bearer, target 0's credential, proves the one item;
# another target's refuses the whole batch
CASES["heartbeats"] = Case(lambda w: post("heartbeats", {"items": [{
    "target_id": w.targets[0]["id"], "heartbeat": {
        "capacity": w.targets[0]["capacity"], "used": w.targets[0]["used"],
        "chunks": w.targets[0]["chunks"]}}]}), **TARGET)
# batched loader telemetry (issue 30): one item naming /m, as report_rank's case; a
# dataset the token may not report on refuses the whole batch
CASES["report_ranks"] = Case(lambda w: post("report_ranks", {"items": [{
    "job": f"j-{next(w.fresh)}", "rank": 0, "report": {
        "interval": 1, "world_size": 1, "samples": 0, "dataset": "/m"}}]}),
    "loader_m", scope="read_m", prefix="write_o")
# a multipart completion's seal (issue 29): the metadata server's, as purge; a release
# of a file never sealed changes nothing
CASES["seal_chunks"] = Case(lambda w: post("seal_chunks", {
    "file_id": "e" * 32, "count": 0, "crcs": [], "release": True}), **CLUSTER_CAP)
