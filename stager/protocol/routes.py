"""Every HTTP route of every stager server, in one table.

The servers register their handlers from this table (by ``op``), and the
OpenAPI document is generated from it, so the document cannot miss a route.
Clients build every URL from the same table: ``route("stat").url(base, path=p)``,
so no route path is written anywhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlencode

from .listing import SHARED
from .models import (
    CHUNK_ID_RE,
    CHUNK_SIZE_BOUNDS,
    MAX_LIST_LIMIT,
    REPLICAS_BOUNDS,
    STRIPE_COUNT_BOUNDS,
    TARGET_ID_RE,
)

_PLACEHOLDER = re.compile(r"\{(\w+)(:[^}]*)?\}")


@dataclass(frozen=True)
class Param:
    name: str
    where: str = "query"          # "query", "path" or "header"
    type: str = "string"
    description: str = ""
    required: bool = False
    bounds: tuple[tuple[str, Any], ...] = ()   # JSON Schema keywords the server enforces

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON Schema: its type and the bounds the server checks."""
        return {"type": self.type, **dict(self.bounds)}


SCOPES_NEEDED = ("public", "any", "read", "write", "admin", "join", "target", "server",
                 "cluster", "telemetry", "s3gateway")
WHERE = ("none", "cluster", "path", "visible", "body", "chunk")


@dataclass(frozen=True)
class Access:
    """What a request needs when auth is on (stager/web/authmw.py checks it).

    ``scope``: ``public`` (no token), ``any`` (any valid user token: not a data
    server's join token or target credential, which do their one job only),
    ``server`` (a join token or a target credential: a data server registering), or
    the scope the token (metadata server) or capability (data server: ``read``,
    ``write`` or ``cluster``, the metadata server's own) must grant.  ``on``: what it must cover:
    ``cluster`` (the whole namespace, ``/``), ``path`` (the URL's path), ``visible``
    (the URL's path, or an ancestor of a covered prefix: walking down to it),
    ``chunk`` (the URL's chunk's file), ``body`` (the handler checks every path
    or chunk the body names, before it acts), ``none``.
    """

    scope: str
    on: str = "cluster"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES_NEEDED or self.on not in WHERE:
            raise ValueError(f"bad access rule {self.scope}/{self.on}")


PUBLIC = Access("public", "none")
ANY = Access("any", "none")
READ_PATH, WRITE_PATH, WRITE_BODY = Access("read", "path"), Access("write", "path"), \
    Access("write", "body")
ADMIN, TARGET = Access("admin"), Access("target")


@dataclass(frozen=True)
class Route:
    method: str
    path: str                     # aiohttp pattern; {path:.*} matches the rest
    op: str                       # operation id = handler name
    summary: str
    role: str                     # "common", "meta" or "data"
    params: tuple[Param, ...] = ()
    body: str | None = None       # a schema name, or "binary"
    responses: dict[int, str] = field(default_factory=dict)  # status → schema / "binary"
    access: Access | None = None  # what a request needs when auth is on (every route has one)

    @property
    def path_params(self) -> tuple[str, ...]:
        """The names of the parameters in the path."""
        return tuple(p.name for p in self.params if p.where == "path")

    def target(self, *, query: Mapping[str, Any] | None = None, **values: Any) -> str:
        """The request target: the path with ``values`` filled in and quoted, then
        ``query`` (``None`` values left out).  A rest-of-path parameter
        (``{path:.*}``) keeps its ``/`` separators and loses a leading ``/``; any
        other parameter is one path segment, ``/`` and all quoted."""
        def fill(m: re.Match[str]) -> str:
            name, rest = m.group(1), m.group(2) is not None
            if name not in values:
                raise KeyError(f"{self.op}: path parameter {name!r} missing")
            text = str(values.pop(name))
            return quote(text.lstrip("/"), safe="/") if rest else quote(text, safe="")

        out = _PLACEHOLDER.sub(fill, self.path)
        if values:
            raise KeyError(f"{self.op}: unknown path parameters {sorted(values)}")
        pairs = [(k, _query_text(v)) for k, v in (query or {}).items() if v is not None]
        return out + ("?" + urlencode(pairs) if pairs else "")

    def url(self, base: str, *, query: Mapping[str, Any] | None = None, **values: Any) -> str:
        """``base`` (``http://host:port``) joined to :meth:`target`."""
        return base.rstrip("/") + self.target(query=query, **values)


def _query_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


P_PATH = Param("path", "path", description="namespace path, / separated", required=True)
P_RANGE = Param("Range", "header", description="a single bytes=START-END range (RFC 9110)")
P_CHUNK = Param("chunk", "path", description="chunk id: FILE_ID.INDEX", required=True,
                bounds=(("pattern", CHUNK_ID_RE.pattern),))
P_TARGET = Param("target_id", "path", required=True, bounds=(("pattern", TARGET_ID_RE.pattern),))
P_PLAN = Param("plan_id", "path", description="a registered plan: 8 to 64 hex digits",
               required=True, bounds=(("pattern", "^[0-9a-f]{8,64}$"),))
LAYOUT_Q = (
    Param("chunk_size", type="integer", description="bytes per chunk",
          bounds=tuple(CHUNK_SIZE_BOUNDS.items())),
    Param("stripe_count", type="integer", description="targets to stripe over (0 = all)",
          bounds=tuple(STRIPE_COUNT_BOUNDS.items())),
    Param("replicas", type="integer", description="copies of each chunk, on distinct nodes",
          bounds=tuple(REPLICAS_BOUNDS.items())),
)
LIMIT_Q = Param("limit", type="integer", description="entries per page",
                bounds=(("minimum", 1), ("maximum", MAX_LIST_LIMIT)))

ERR = {400: "Error", 404: "Error", 409: "Error", 413: "Error", 503: "Error"}

ROUTES: tuple[Route, ...] = (
    # every server
    Route("GET", "/v1/health", "health", "liveness and identity", "common",
          responses={200: "Health"}),
    Route("GET", "/openapi.json", "openapi", "this document", "common", responses={200: "object"}),
    Route("GET", "/metrics", "metrics", "Prometheus metrics (text format)", "common",
          responses={200: "text"}),
    # metadata server: cluster
    Route("GET", "/v1/status", "status", "cluster status: targets, nodes, capacity, health",
          "meta", responses={200: "Status"}),
    Route("GET", "/v1/targets", "list_targets", "registered storage targets", "meta",
          responses={200: "TargetList"}),
    Route("POST", "/v1/targets", "register_target",
          "a data server registers a target: a new one with a join (or admin) token, which "
          "answers the target's own credential once; a known one with that credential",
          "meta", body="Target", responses={200: "TargetRegistered", 400: "Error",
                                            403: "Error", 409: "Error"}),
    Route("POST", "/v1/targets/{target_id}/heartbeat", "heartbeat",
          "a data server reports it is alive", "meta", params=(P_TARGET,), body="Heartbeat",
          responses={200: "Target", 404: "Error"}),
    Route("POST", "/v1/targets/{target_id}/leave", "leave_target",
          "a data server that is stopping says so: its target is down at once, not after "
          "missed heartbeats (up again when it heartbeats)", "meta", params=(P_TARGET,),
          responses={200: "Target", 404: "Error"}),
    Route("POST", "/v1/targets/{target_id}/remove", "remove_target",
          "declare a target lost: its chunks are re-replicated onto other targets", "meta",
          params=(P_TARGET,), responses={200: "Target", 404: "Error"}),
    Route("POST", "/v1/targets/{target_id}/forget", "forget_target",
          "drop a lost or removed target whose chunks are copied elsewhere: it leaves the "
          "listing and its credential is revoked", "meta", params=(P_TARGET,),
          responses={200: "Target", 404: "Error", 409: "Error"}),
    # metadata server: reliability (stager/meta/upkeep/reliability.py)
    Route("POST", "/v1/scrub", "scrub",
          "verify every chunk on every up target now; repair corrupt copies from replicas",
          "meta", body="ScrubRequest", responses={200: "ScrubResult", 400: "Error"}),
    Route("POST", "/v1/scrub/report", "scrub_report",
          "a data server reports chunks that failed verification", "meta",
          body="ScrubReport", responses={200: "ScrubQueued", 400: "Error"}),
    Route("POST", "/v1/fsck", "fsck",
          "namespace against chunks: missing and orphan chunks (repair: fix them)", "meta",
          body="FsckRequest", responses={200: "FsckResult", 400: "Error"}),
    # metadata server: loader telemetry (stager/meta/jobtable.py, stager/protocol/jobreport.py)
    Route("PUT", "/v1/jobs/{job}/ranks/{rank}", "report_rank",
          "a loader (one rank, or one DataLoader worker of it) reports its telemetry; "
          "the entry expires after 3 report intervals without news", "meta",
          params=(Param("job", "path", description="job name", required=True),
                  Param("rank", "path", type="integer", required=True,
                        bounds=(("minimum", 0),)),
                  Param("worker", type="integer", description="DataLoader worker id",
                        bounds=(("minimum", 0),))),
          body="JobReport", responses={200: "RankRecorded", 400: "Error", 413: "Error",
                                       503: "Error"}),
    Route("GET", "/v1/jobs", "list_jobs",
          "live loader telemetry: every job, its ranks and a summary, worst stall first",
          "meta", responses={200: "JobList"}),
    # metadata server: the dashboard (stager/meta/http/ui/: static files over the JSON API)
    Route("GET", "/ui/{asset:.*}", "dashboard",
          "the live dashboard: /ui/ is its page, the rest its script and style", "meta",
          params=(Param("asset", "path", description="a file of the dashboard; empty: "
                        "the page", required=True),),
          responses={200: "asset", 404: "Error"}),
    # metadata server: namespace
    Route("GET", "/v1/stat/{path:.*}", "stat", "stat a file or directory", "meta",
          params=(P_PATH,), responses={200: "FileInfo", 400: "Error", 404: "Error"}),
    Route("GET", "/v1/list/{path:.*}", "list", "list a directory, one page at a time", "meta",
          params=(P_PATH, LIMIT_Q, Param("after"),
                  Param("detail", type="boolean"),
                  Param("layouts", description=f"{SHARED}: each layout once, in the "
                        "page's layouts, and each entry's layout its index there",
                        bounds=(("enum", (SHARED,)),))),
          responses={200: "Listing", 404: "Error", 409: "Error"}),
    Route("POST", "/v1/mkdir", "mkdir", "make a directory (with parents: mkdir -p)", "meta",
          body="MkdirRequest", responses={200: "FileInfo", **ERR}),
    Route("POST", "/v1/layout", "set_layout",
          "set the default layout new files in a directory inherit (like lfs setstripe)", "meta",
          body="SetLayoutRequest", responses={200: "FileInfo", **ERR}),
    # writes, each a batch (stager/protocol/batch.py); a single write is a batch of one.
    # A malformed batch fails whole (400/413); an item that fails against the namespace
    # fails alone, its error in its place
    Route("POST", "/v1/create", "create",
          "begin writes in one transaction: per item, the file id and layout, or an error",
          "meta", body="CreateRequest", responses={200: "CreateResult", 400: "Error",
                                                   413: "Error", 503: "Error"}),
    Route("POST", "/v1/commit", "commit",
          "finish writes in one transaction: per item, the file now visible, or an error",
          "meta", body="CommitRequest", responses={200: "CommitResult", 400: "Error",
                                                   413: "Error"}),
    Route("POST", "/v1/abort", "abort",
          "abandon writes in one transaction (their chunks are collected); per-item errors",
          "meta", body="AbortRequest", responses={200: "AbortResult", 400: "Error",
                                                  413: "Error"}),
    Route("POST", "/v1/reroute", "reroute",
          "chunk writes to a target failed: give each upload a layout with another target in "
          "its slot (the target turns suspect only if it fails the metadata server's own "
          "probe too); per-item uploads or errors",
          "meta", body="RerouteRequest", responses={200: "CreateResult", 400: "Error",
                                                    413: "Error"}),
    Route("POST", "/v1/rename", "rename", "rename a file or directory", "meta",
          body="RenameRequest", responses={200: "FileInfo", **ERR, 507: "Error"}),
    Route("POST", "/v1/remove", "remove", "delete a file, or a directory (recursive)", "meta",
          body="RemoveRequest", responses={200: "RemoveResult", **ERR}),
    Route("PUT", "/v1/manifest/{path:.*}", "put_manifest",
          "record a dataset manifest on a directory (staging does this)", "meta",
          params=(P_PATH,), body="Manifest", responses={200: "ManifestStored", **ERR}),
    Route("GET", "/v1/manifest/{path:.*}", "get_manifest",
          "a directory's dataset manifest, resolved: layouts, checksums, stale files", "meta",
          params=(P_PATH,), responses={200: "Manifest", 404: "Error"}),
    # metadata server: quotas and pins (stager/meta/quotas.py, stager/protocol/quotas.py)
    Route("GET", "/v1/quotas", "list_quotas",
          "every directory quota with its use (those on paths the token may read)", "meta",
          responses={200: "QuotaList"}),
    Route("PUT", "/v1/quotas/{path:.*}", "set_quota",
          "set a directory's quota in bytes and/or files, its use counted now (both null: "
          "no quota); a write past it fails with 507 quota_exceeded", "meta",
          params=(P_PATH,), body="QuotaRequest", responses={200: "Quota", **ERR}),
    Route("GET", "/v1/pins", "list_pins",
          "every pin alive (those on paths the token may read)", "meta",
          responses={200: "PinList"}),
    Route("PUT", "/v1/pins/{path:.*}", "pin",
          "pin a file or directory: never evicted until unpinned or its ttl ends", "meta",
          params=(P_PATH,), body="PinRequest", responses={200: "Pin", **ERR}),
    Route("DELETE", "/v1/pins/{path:.*}", "unpin", "drop a pin", "meta",
          params=(P_PATH,), responses={200: "Unpinned", 404: "Error"}),
    # metadata server: attached directories, filled on read (stager/meta/cache/)
    Route("GET", "/v1/attachments", "list_attachments",
          "every attached directory, with its files, bytes cached and hit ratio (those on "
          "paths the token may read)", "meta", responses={200: "AttachmentList"}),
    Route("PUT", "/v1/attachments/{path:.*}", "attach",
          "make a directory a view of a source URL: listed now, each file's chunks fetched "
          "on first read and kept", "meta",
          params=(P_PATH,), body="AttachRequest",
          responses={200: "Refreshed", **ERR, 502: "Error"}),
    Route("POST", "/v1/refresh/{path:.*}", "refresh_attachment",
          "list an attached directory's source again: changed files' cached bytes are "
          "dropped, vanished files go", "meta",
          params=(P_PATH,), responses={200: "Refreshed", **ERR, 502: "Error"}),
    Route("DELETE", "/v1/attachments/{path:.*}", "detach",
          "forget an attached directory's view and free its cached bytes", "meta",
          params=(P_PATH,), responses={200: "Detached", **ERR}),
    Route("POST", "/v1/fill", "fill",
          "the CRC32C of chunks of cached files about to be read, each fetched from its "
          "source first when missing (one fetch per chunk however many readers)", "meta",
          body="FillRequest", responses={200: "FillResults", **ERR, 502: "Error"}),
    Route("POST", "/v1/cache/reads", "cache_reads",
          "count reads of filled chunks that a client read straight from the data servers "
          "(their CRC32Cs learnt from an earlier fill) as hits, and mark them used for "
          "eviction; fetches nothing", "meta",
          body="FillRequest", responses={200: "ReadsCounted", **ERR}),
    Route("PUT", "/v1/plans/{plan_id}", "register_plan",
          "register a Loader's epoch plan over cached files (parameters, not the list): "
          "eviction keeps what it reads soonest, fills run ahead of it", "meta",
          params=(P_PLAN,), body="PlanRequest", responses={200: "PlanRegistered", **ERR}),
    Route("POST", "/v1/plans/{plan_id}/position", "plan_position",
          "where a registered plan's job is now (its registrant only)", "meta",
          params=(P_PLAN,), body="PlanPosition", responses={200: "PlanPosition", **ERR}),
    # metadata server: whole-file gateway for plain HTTP clients
    Route("GET", "/v1/files/{path:.*}", "gateway_get",
          "read a whole file (Range honoured) or list a directory", "meta",
          params=(P_PATH, P_RANGE, LIMIT_Q, Param("after")),
          responses={200: "binary", 206: "binary", 404: "Error", 416: "Error", 502: "Error",
                     503: "Error"}),
    Route("HEAD", "/v1/files/{path:.*}", "gateway_head", "size and type of a file", "meta",
          params=(P_PATH,), responses={200: "binary", 404: "Error"}),
    Route("PUT", "/v1/files/{path:.*}", "gateway_put", "write a whole file from the body", "meta",
          params=(P_PATH, *LAYOUT_Q), body="binary",
          responses={201: "FileInfo", **ERR, 507: "Error"}),
    Route("DELETE", "/v1/files/{path:.*}", "gateway_delete", "delete a file or directory",
          "meta", params=(P_PATH, Param("recursive", type="boolean")),
          responses={200: "RemoveResult", **ERR}),
    # data server
    Route("PUT", "/v1/chunks/{chunk}", "put_chunk",
          "store a chunk durably (X-Stager-Crc32c verified); answers the size and CRC32C "
          "read back from what was stored", "data",
          params=(P_CHUNK, Param("X-Stager-Crc32c", "header", required=True)), body="binary",
          responses={201: "ChunkInfo", 400: "Error", 413: "Error", 507: "Error"}),
    Route("GET", "/v1/chunks/{chunk}", "get_chunk", "read a chunk (Range honoured)", "data",
          params=(P_CHUNK, P_RANGE),
          responses={200: "binary", 206: "binary", 404: "Error", 416: "Error"}),
    Route("HEAD", "/v1/chunks/{chunk}", "head_chunk", "size and checksum of a chunk", "data",
          params=(P_CHUNK,), responses={200: "binary", 404: "Error"}),
    Route("DELETE", "/v1/chunks/{chunk}", "delete_chunk", "delete a chunk", "data",
          params=(P_CHUNK,), responses={200: "ChunkDeleted"}),
    Route("POST", "/v1/write", "batch_write",
          "store many chunks durably in one request: a JSON line [[chunk, size, crc32c], ...] "
          "then their bytes; every checksum is checked before any is written; answers each "
          "chunk's size and CRC32C read back from what was stored", "data",
          body="binary", responses={201: "ChunkBatchInfo", 400: "Error", 413: "Error",
                                    507: "Error"}),
    Route("POST", "/v1/read", "batch_read",
          "many (chunk, offset, length) pieces in one streamed response", "data",
          body="ReadRequest", responses={200: "binary", 400: "Error", 404: "Error",
                                         416: "Error"}),
    Route("POST", "/v1/purge", "purge", "delete every chunk of the given files", "data",
          body="PurgeRequest", responses={200: "RemoveResult"}),
    Route("POST", "/v1/seal", "seal_chunks",
          "seal a completed multipart object's chunks: a later write of one with other "
          "bytes is refused; answers the sealed chunks not stored with their CRC32C", "data",
          body="SealRequest", responses={200: "SealResult", 400: "Error"}),
    Route("GET", "/v1/chunks", "list_chunks",
          "every chunk stored, one [chunk, size, mtime] JSON array per line", "data",
          responses={200: "ndjson"}),
    Route("POST", "/v1/scrub", "scrub_chunks",
          "verify every chunk's checksums now; progress lines, then the result line", "data",
          body="ScrubRequest", responses={200: "ndjson", 400: "Error"}),
)


# metadata server: S3 keys, and an S3 gateway's one question (stager/meta/http/s3keys.py)
_S3KEY_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/s3/keys", "s3key_create",
          "mint a bearer token and an S3 key bound to it (admin): the secret is shown once",
          "meta", body="TokenRequest", responses={200: "S3KeyCreated", 400: "Error",
                                                  404: "Error"}),
    Route("GET", "/v1/s3/keys", "s3key_list", "every S3 key, by its token (admin)", "meta",
          responses={200: "S3KeyList", 404: "Error"}),
    Route("POST", "/v1/s3/verify", "s3key_verify",
          "an S3 gateway asks whether a signature signs a string with a key's secret: the "
          "day's signing key and the token to act with, or the S3 error (s3gateway)", "meta",
          body="S3VerifyRequest", responses={200: "S3Verdict", 400: "Error", 404: "Error"}),
)

# metadata server: token administration and capabilities (stager/meta/http/authapp.py)
_AUTH_ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/auth/key", "auth_key",
          "the metadata server's Ed25519 public key (PEM), which data servers verify "
          "capabilities with; 404 when auth is off", "meta",
          responses={200: "PublicKey", 404: "Error"}),
    Route("POST", "/v1/tokens", "create_token", "mint a bearer token (admin)", "meta",
          body="TokenRequest", responses={200: "TokenCreated", 400: "Error", 404: "Error"}),
    Route("GET", "/v1/tokens", "list_tokens", "every token minted, revoked or not (admin)",
          "meta", responses={200: "TokenList", 404: "Error"}),
    Route("POST", "/v1/tokens/{token_id}/revoke", "revoke_token",
          "revoke a token: refused from the next request on (admin)", "meta",
          params=(Param("token_id", "path", required=True,
                        bounds=(("pattern", "^[0-9a-f]{32}$"),)),),
          responses={200: "TokenInfo", 404: "Error"}),
    Route("POST", "/v1/capabilities", "capabilities",
          "short-lived capabilities for chunk reads or writes of files by id; per-item "
          "capabilities or errors: a batch capability's text on the first of its files, "
          "null on the rest (the item before's); null throughout when auth is off", "meta",
          body="CapabilityRequest", responses={200: "CapabilityResult", 400: "Error",
                                               413: "Error"}),
)
ROUTES = ROUTES + _AUTH_ROUTES + _S3KEY_ROUTES
P_UPLOAD = Param("upload_id", "path", description="a multipart upload", required=True,
                 bounds=(("pattern", "^[0-9a-f]{32}$"),))
P_PART = Param("number", "path", type="integer", description="a part number", required=True,
               bounds=(("minimum", 1), ("maximum", 10000)))
# metadata server: S3 multipart uploads (stager/meta/multipart.py, stager/protocol/multipart.py)
_MULTIPART_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/multipart", "multipart_create",
          "begin a multipart upload of a file: invisible until completed", "meta",
          body="MultipartCreate", responses={200: "MultipartUpload", **ERR}),
    Route("GET", "/v1/multipart", "multipart_list",
          "multipart uploads in progress under a path prefix, by (path, upload id)", "meta",
          params=(Param("prefix"), Param("after_path"), Param("after_id"), LIMIT_Q),
          responses={200: "MultipartList", **ERR}),
    Route("GET", "/v1/multipart/{upload_id}", "multipart_parts",
          "a multipart upload and its parts, by number", "meta",
          params=(P_UPLOAD,), responses={200: "PartList", **ERR}),
    Route("POST", "/v1/multipart/{upload_id}/parts/{number}", "multipart_part_begin",
          "where part N of this size goes: the final file's chunk slots when the size "
          "allows, else a hidden file of its own", "meta",
          params=(P_UPLOAD, P_PART), body="PartBegin", responses={200: "PartSlot", **ERR}),
    Route("PUT", "/v1/multipart/{upload_id}/parts/{number}", "multipart_part_done",
          "record part N as written (replacing one sent before)", "meta",
          params=(P_UPLOAD, P_PART), body="PartDone", responses={200: "Part", **ERR}),
    Route("POST", "/v1/multipart/{upload_id}/complete", "multipart_complete",
          "complete: the file committed as its parts lie, or the parts to compose", "meta",
          params=(P_UPLOAD,), body="CompleteRequest", responses={200: "CompleteResult", **ERR}),
    Route("DELETE", "/v1/multipart/{upload_id}", "multipart_abort",
          "drop a multipart upload: its parts' chunks are collected", "meta",
          params=(P_UPLOAD,), responses={200: "MultipartUpload", **ERR}),
)
ROUTES = ROUTES + _MULTIPART_ROUTES
# A data server process's heartbeats for all its targets in one request, each item proven
# by its target's credential (stager/protocol/heartbeats.py, stager/meta/http/heartbeats.py).
ROUTES = ROUTES + (Route("POST", "/v1/heartbeats", "heartbeats",
                         "a data server reports all its targets alive in one request: items "
                         "of {target_id, heartbeat, credential}; a result (Target or error) "
                         "per item", "meta", body="HeartbeatBatch",
                         responses={200: "object", 400: "Error", 413: "Error"}),)
# Many loaders' telemetry in one request: a node's ranks, or a job leader's (issue 30;
# stager/protocol/jobreport.py, stager/meta/jobtable.py).
ROUTES = ROUTES + (Route("POST", "/v1/jobs/reports", "report_ranks",
                         "many loaders report their telemetry in one request: items of "
                         "{job, rank, worker, report}; a result (RankRecorded or error) per "
                         "item", "meta", body="JobReportBatch",
                         responses={200: "object", 400: "Error", 403: "Error",
                                    413: "Error"}),)

# What each operation needs when auth is on: one line per route, checked complete below.
ACCESS: dict[str, Access] = {
    "health": PUBLIC, "openapi": PUBLIC, "metrics": PUBLIC,
    "dashboard": PUBLIC,    # static files: the data comes from the API, with a token
    # cluster
    # a target's own credential (scope "target"; the handler checks it is that target's)
    "status": ANY, "list_targets": ANY, "register_target": Access("server", "body"),
    "heartbeat": TARGET, "leave_target": TARGET, "remove_target": ADMIN,
    "forget_target": ADMIN, "scrub": ADMIN, "scrub_report": TARGET, "fsck": ADMIN,
    "report_rank": Access("telemetry", "body"), "list_jobs": Access("read", "none"),
    # namespace
    "stat": Access("read", "visible"), "list": Access("read", "visible"),
    "mkdir": WRITE_BODY, "set_layout": WRITE_BODY, "create": WRITE_BODY, "commit": WRITE_BODY,
    "abort": WRITE_BODY, "reroute": WRITE_BODY, "rename": WRITE_BODY, "remove": WRITE_BODY,
    "put_manifest": WRITE_PATH, "get_manifest": READ_PATH,
    "list_quotas": Access("read", "none"), "set_quota": Access("admin", "path"),
    "list_pins": Access("read", "none"), "pin": WRITE_PATH, "unpin": WRITE_PATH,
    "list_attachments": Access("read", "none"), "attach": Access("admin", "path"),
    "refresh_attachment": WRITE_PATH, "detach": Access("admin", "path"),
    "fill": Access("read", "body"), "cache_reads": Access("read", "body"),
    "register_plan": Access("read", "body"),
    "plan_position": Access("read", "none"),
    "gateway_get": Access("read", "visible"), "gateway_head": READ_PATH,
    "gateway_put": WRITE_PATH, "gateway_delete": WRITE_PATH,
    # multipart: the handler checks the upload's path (a listing shows what may be read)
    "multipart_create": WRITE_BODY, "multipart_list": Access("read", "none"),
    "multipart_parts": Access("read", "body"), "multipart_part_begin": WRITE_BODY,
    "multipart_part_done": WRITE_BODY, "multipart_complete": WRITE_BODY,
    "multipart_abort": WRITE_BODY,
    # auth
    "auth_key": PUBLIC, "create_token": ADMIN, "list_tokens": ADMIN, "revoke_token": ADMIN,
    "capabilities": Access("any", "body"),
    "s3key_create": ADMIN, "s3key_list": ADMIN, "s3key_verify": Access("s3gateway"),
    # data server: capabilities, not tokens
    "put_chunk": Access("write", "chunk"), "get_chunk": Access("read", "chunk"),
    "head_chunk": Access("read", "chunk"), "delete_chunk": Access("cluster"),
    "batch_write": Access("write", "body"), "batch_read": Access("read", "body"),
    "purge": Access("cluster"), "list_chunks": Access("cluster"),
    "seal_chunks": Access("cluster"),
    "scrub_chunks": Access("cluster"),
    "heartbeats": Access("target", "body"),     # each item proven by its handler
    "report_ranks": Access("telemetry", "body"),    # each item's dataset, by its handler
}
_OPS = {r.op for r in ROUTES}
if set(ACCESS) != _OPS:
    raise RuntimeError(f"routes without an access rule: {sorted(_OPS - set(ACCESS))}; "
                       f"rules without a route: {sorted(set(ACCESS) - _OPS)}")
ROUTES = tuple(replace(r, access=ACCESS[r.op]) for r in ROUTES)


def routes_for(role: str) -> tuple[Route, ...]:
    return tuple(r for r in ROUTES if r.role in ("common", role))


_BY_OP: dict[str, Route] = {r.op: r for r in ROUTES}


def route(op: str) -> Route:
    """The route whose operation id is ``op`` (``KeyError`` when none is)."""
    return _BY_OP[op]
