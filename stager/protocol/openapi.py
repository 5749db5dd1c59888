"""The OpenAPI 3.1 document of each server, generated from :data:`ROUTES`."""

from __future__ import annotations

from typing import Any

from ..version import __version__
from .authmsg import MAX_TTL
from .cache import SCHEMAS as CACHE_SCHEMAS
from .headers import CAPABILITY
from .jobreport import SCHEMAS as JOB_SCHEMAS
from .messages import MIN_SCRUB_RATE
from .models import (
    BOOT_RE,
    CHUNK_ID_RE,
    CHUNK_SIZE_BOUNDS,
    COUNT_BOUNDS,
    FILE_ID_RE,
    MAX_ATTRS,
    REPLICAS_BOUNDS,
    STRIPE_COUNT_BOUNDS,
    TARGET_ID_RE,
)
from .multipart import SCHEMAS as MULTIPART_SCHEMAS
from .quotas import SCHEMAS as QUOTA_SCHEMAS
from .routes import Route, routes_for
from .s3keys import SCHEMAS as S3KEY_SCHEMAS

_INT = {"type": "integer"}
_STR = {"type": "string"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
# What the parsers check, so a generated request can be valid (and an invalid one knowingly so)
_COUNT = {**_INT, **COUNT_BOUNDS}
_FILE_ID = {**_STR, "pattern": FILE_ID_RE.pattern}
_CHUNK_ID = {**_STR, "pattern": CHUNK_ID_RE.pattern}
_TARGET_ID = {**_STR, "pattern": TARGET_ID_RE.pattern}
_URL = {**_STR, "pattern": "^https?://"}
_BOOT = {**_STR, "pattern": BOOT_RE.pattern}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_CHUNK_SIZE = {**_INT, **CHUNK_SIZE_BOUNDS}
_REPLICAS = {**_INT, **REPLICAS_BOUNDS}
LAYOUT_SPEC = _obj({"chunk_size": _CHUNK_SIZE, "stripe_count": {**_INT, **STRIPE_COUNT_BOUNDS},
                    "replicas": _REPLICAS})

SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _STR, "message": _STR, "details": {"type": "object"}},
                  ("error", "message")),
    "Health": _obj({"ok": _BOOL, "role": _STR, "version": _STR, "id": _STR, "node": _STR},
                   ("ok", "role", "version")),
    "LayoutSpec": LAYOUT_SPEC,
    "Layout": _obj({"chunk_size": _CHUNK_SIZE,
                    "stripe_count": {**_INT, **STRIPE_COUNT_BOUNDS, "minimum": 1},
                    "replicas": _REPLICAS,
                    "targets": {"type": "array", "items": _STR},
                    "nodes": {"type": "array", "items": _STR}, "cached": _BOOL},
                   ("chunk_size", "stripe_count", "replicas", "targets", "nodes")),
    "FileInfo": _obj({"path": _STR, "type": {"enum": ["file", "directory"]}, "size": _INT,
                      "mtime": _NUM, "file_id": _STR, "layout": _ref("Layout"),
                      "default_layout": _ref("LayoutSpec"),
                      "checksums": {"type": "array", "items": _STR},
                      "locations": {"type": "object", "additionalProperties": _STR},
                      "capability": _STR, "attrs": _ref("Attrs")},
                     ("path", "type", "size", "mtime")),
    # a file version's attributes (the S3 gateway's under "s3"): set by its commit, absent
    # when empty; a rewrite by any other way has none
    "Attrs": {"type": "object", "description": f"any JSON object, at most {MAX_ATTRS} bytes "
              "as compact JSON with sorted keys (more: 400 bad_request)"},
    # with layouts=shared (stager/protocol/listing.py): each layout of the page once, in
    # layouts, and each entry's layout (a SharedEntry) its index there
    "Listing": _obj({"path": _STR, "layouts": {"type": "array", "items": _ref("SharedLayout")},
                     "entries": {"type": "array", "items": {
                         "anyOf": [_ref("FileInfo"), _ref("SharedEntry")]}},
                     "next": {"type": ["string", "null"]}}, ("entries",)),
    "Target": _obj({"id": _TARGET_ID, "node": _STR, "url": _URL, "capacity": _COUNT,
                    "used": _COUNT, "state": _STR, "last_heartbeat": _NUM, "chunks": _COUNT,
                    "boot": _BOOT},
                   ("id", "node", "url")),
    "TargetRegistered": _obj({"id": _TARGET_ID, "node": _STR, "url": _URL,
                              "capacity": _COUNT, "used": _COUNT, "state": _STR,
                              "last_heartbeat": _NUM, "chunks": _COUNT, "boot": _BOOT,
                              "credential": {"type": ["string", "null"]}},
                             ("id", "node", "url")),
    "TargetList": _obj({"targets": {"type": "array", "items": _ref("Target")}}),
    "Heartbeat": _obj({"capacity": _COUNT, "used": _COUNT, "chunks": _COUNT,
                       "bytes_read": _COUNT, "bytes_written": _COUNT,
                       "scrub": _ref("ScrubProgress")}),
    "HeartbeatBatch": _obj({"items": {"type": "array", "items": _obj(
        {"target_id": {"type": "string", "pattern": TARGET_ID_RE.pattern},
         "heartbeat": _ref("Heartbeat"), "credential": {"type": ["string", "null"]}},
        ("target_id", "heartbeat"))}}, ("items",)),
    "ScrubProgress": _obj({"state": {"enum": ["idle", "running"]}, "passes": _COUNT,
                           "chunks_done": _COUNT, "chunks_total": _COUNT,
                           "bytes_done": _COUNT, "bytes_total": _COUNT,
                           "bytes_remaining": _COUNT, "corrupt_found": _COUNT,
                           "started": _NUM, "finished": _NUM}),
    "Status": {**_obj({"targets": {"type": "array", "items": _ref("Target")}, "nodes": _INT,
                       "targets_up": _INT, "capacity": _INT, "used": _INT, "files": _INT,
                       "directories": _INT, "bytes": _INT,
                       "metas": {"type": "array", "items": _ref("MetaServer")},
                       # target id → when that down target is declared lost
                       "lost_at": {"type": "object", "additionalProperties": _NUM}},
                      ("targets", "nodes", "targets_up", "capacity", "used", "files",
                       "directories", "bytes")),
               # the background services' sections: rebuild, repair, fsck, targets_lost
               "additionalProperties": True},
    "MetaServer": _obj({"url": _URL, "store": _STR, "state": {"enum": ["up", "down"]},
                        "duties": _BOOL, "last_seen": _NUM},
                       ("url", "store", "state", "duties", "last_seen")),
    "MkdirRequest": _obj({"path": _STR, "parents": _BOOL, "exist_ok": _BOOL,
                          "layout": _ref("LayoutSpec")}, ("path",)),
    "SetLayoutRequest": _obj({"path": _STR, "layout": _ref("LayoutSpec")}, ("path", "layout")),
    "CreateItem": _obj({"path": _STR, "layout": _ref("LayoutSpec"), "overwrite": _BOOL,
                        "parents": _BOOL}, ("path",)),
    "Upload": _obj({"file_id": _STR, "path": _STR, "layout": _ref("Layout"),
                    "locations": {"type": "object", "additionalProperties": _STR},
                    "capability": _STR},
                   ("file_id", "path", "layout", "locations")),
    "CommitItem": _obj({"file_id": _FILE_ID, "size": _COUNT, "mtime": _NUM,
                        "checksums": {"type": "array", "items": _STR}, "attrs": _ref("Attrs")},
                       ("file_id", "size", "checksums")),
    "RerouteRequest": _obj({"target": _STR, "code": _STR, "reason": _STR, "items": {
        "type": "array", "items": _obj({"file_id": _STR, "chunks": _INT},
                                       ("file_id", "chunks"))}},
        ("target", "items")),
    "ItemError": _obj({"error": _STR, "message": _STR, "status": _INT,
                       "details": {"type": "object"}}, ("error", "message", "status")),
    # the writes: each a batch (stager/protocol/batch.py), answered item by item
    "CreateRequest": _obj({"items": {"type": "array", "items": _ref("CreateItem")}},
                          ("items",)),
    "CreateResult": _obj({"results": {"type": "array", "items": {
        "oneOf": [_ref("Upload"), _ref("ItemError")]}}}, ("results",)),
    "CommitRequest": _obj({"items": {"type": "array", "items": _ref("CommitItem")}},
                          ("items",)),
    "CommitResult": _obj({"results": {"type": "array", "items": {
        "oneOf": [_ref("FileInfo"), _ref("ItemError")]}}}, ("results",)),
    "AbortRequest": _obj({"file_ids": {"type": "array", "items": _FILE_ID}}, ("file_ids",)),
    "AbortResult": _obj({"results": {"type": "array", "items": {
        "oneOf": [{"type": "null"}, _ref("ItemError")]}}}, ("results",)),
    "ChunkBatchInfo": _obj({"chunks": _INT, "bytes": _INT, "stored": {
        "type": "array", "items": _ref("ChunkInfo")}}, ("chunks", "bytes", "stored")),
    "RenameRequest": _obj({"src": _STR, "dst": _STR, "overwrite": _BOOL}, ("src", "dst")),
    "RemoveRequest": _obj({"path": _STR, "recursive": _BOOL}, ("path",)),
    "RemoveResult": _obj({"removed": _INT}),
    "ChunkInfo": _obj({"chunk": _STR, "size": _INT, "crc32c": _STR},
                      ("chunk", "size", "crc32c")),
    "ReadRequest": _obj({"items": {"type": "array", "items": {
        "type": "array", "prefixItems": [_CHUNK_ID, _COUNT, _COUNT], "minItems": 3,
        "maxItems": 3}}},
        ("items",)),
    "Manifest": _obj({"version": _INT, "path": _STR, "source": _STR, "created": _NUM,
                      "extra": {"type": "object"},
                      "files": {"type": "array", "items": _obj(
                          {"path": _STR, "size": _COUNT, "mtime": _NUM, "file_id": _FILE_ID,
                           "layout": _INT, "checksums": {"type": "array", "items": _STR},
                           "stale": _BOOL}, ("path", "size", "file_id"))},
                      "layouts": {"type": "array", "items": _ref("Layout")},
                      "locations": {"type": "object", "additionalProperties": _STR}},
                     ("files",)),
    "ManifestStored": _obj({"path": _STR, "files": _INT}, ("path", "files")),
    "ChunkDeleted": _obj({"deleted": _BOOL}, ("deleted",)),
    "PurgeRequest": _obj({"file_ids": {"type": "array", "items": _FILE_ID}}, ("file_ids",)),
    "ScrubRequest": _obj({"rate": {**_INT, "anyOf": [
        {"const": 0}, {"minimum": MIN_SCRUB_RATE, "maximum": COUNT_BOUNDS["maximum"]}]}}),
    "ScrubReport": _obj({"target": _STR, "chunks": {"type": "array", "items": _STR}},
                        ("target", "chunks")),
    "ScrubQueued": _obj({"queued": _INT}, ("queued",)),
    "ScrubResult": _obj({"targets": {"type": "object", "additionalProperties": {
                             "type": "object"}},
                         "checked": _INT, "bytes": _INT, "corrupt": _INT, "repaired": _INT,
                         "unrecoverable": _INT, "deferred": _INT, "ignored": _INT,
                         "unreachable": {"type": "array", "items": _STR}, "seconds": _NUM},
                        ("targets", "checked", "bytes", "corrupt", "repaired", "unrecoverable",
                         "deferred", "ignored", "unreachable", "seconds")),
    "FsckRequest": _obj({"repair": _BOOL}),
    "FsckResult": _obj({"clean": _BOOL, "files": _INT, "chunks_expected": _INT,
                        "chunks_found": _INT, "missing": _INT, "orphans": _INT,
                        "orphans_deleted": _INT, "repaired": _INT, "under_replicated": _INT,
                        "missing_list": {"type": "array", "items": _obj(
                            {"file_id": _STR, "chunk": _STR, "target": _STR,
                             "path": {"type": ["string", "null"]}})},
                        "orphan_list": {"type": "array", "items": _obj(
                            {"target": _STR, "chunk": _STR})},
                        "unreachable": {"type": "array", "items": _STR}, "seconds": _NUM},
                       ("clean", "files", "chunks_expected", "chunks_found", "missing",
                        "missing_list", "orphans", "orphan_list", "unreachable",
                        "under_replicated", "repaired", "orphans_deleted", "seconds")),
    # tokens and capabilities (stager/protocol/authmsg.py)
    "PublicKey": _obj({"public_key": _STR}, ("public_key",)),
    "TokenRequest": _obj({"scopes": {"type": "array", "minItems": 1, "items": {
                              "enum": ["read", "write", "admin", "join"]}},
                          "prefixes": {"type": "array", "minItems": 1, "maxItems": 64,
                                       "items": _STR},
                          "ttl": {**_INT, "minimum": 1, "maximum": MAX_TTL},
                          "name": {**_STR, "maxLength": 200},
                          "uses": {"type": ["integer", "null"], "minimum": 1}}, ("scopes",)),
    "TokenInfo": _obj({"id": _STR, "name": _STR, "scopes": {"type": "array", "items": _STR},
                       "prefixes": {"type": "array", "items": _STR}, "created": _INT,
                       "expires": _INT, "revoked": {"type": ["integer", "null"]},
                       "uses": {"type": ["integer", "null"]}},
                      ("id", "name", "scopes", "prefixes", "created", "expires")),
    "TokenCreated": _obj({"token": _STR, "info": _ref("TokenInfo")}, ("token", "info")),
    "TokenList": _obj({"tokens": {"type": "array", "items": _ref("TokenInfo")}},
                      ("tokens",)),
    "CapabilityRequest": _obj({"op": {"enum": ["read", "write"]},
                               "file_ids": {"type": "array", "items": _FILE_ID}},
                              ("op", "file_ids")),
    "CapabilityResult": _obj({"results": {"type": "array", "items": {"oneOf": [
        {"type": "null"}, _obj({"file_id": _STR, "capability": {"type": ["string", "null"]}},
                               ("file_id", "capability")),
        _ref("ItemError")]}}}, ("results",)),
    **JOB_SCHEMAS,
    **QUOTA_SCHEMAS,
    **S3KEY_SCHEMAS,
    **MULTIPART_SCHEMAS,
    **CACHE_SCHEMAS,
}



def _but(name: str, **props: Any) -> dict[str, Any]:
    """Schema ``name``, with ``props`` for some of its properties."""
    return {**SCHEMAS[name], "properties": {**SCHEMAS[name]["properties"], **props}}


# A shared page's layout carries its targets' URLs, which its entries then leave out
SCHEMAS["SharedLayout"] = _but("Layout", locations=SCHEMAS["FileInfo"]["properties"]["locations"])
SCHEMAS["SharedEntry"] = _but("FileInfo", layout={**_INT, "minimum": 0,
                                                  "description": "an index into layouts"})

# With auth on: a bearer token to the metadata server, capabilities to data servers.
SECURITY_SCHEMES = {
    "meta": {"bearer": {"type": "http", "scheme": "bearer",
                        "description": "a token from `stager token create`"}},
    "data": {"capability": {"type": "apiKey", "in": "header", "name": CAPABILITY,
                            "description": "capabilities the metadata server handed out "
                                           "with layouts, space separated; ref1.<id> "
                                           "for a text this data server verified "
                                           "(401 unknown_reference otherwise)"}},
}


def _content(schema: str) -> dict[str, Any]:
    if schema == "binary":
        return {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}
    if schema == "text":
        return {"text/plain": {"schema": _STR}}
    if schema == "asset":       # the dashboard's files (stager/meta/http/ui/)
        return {t: {"schema": _STR} for t in ("text/html", "text/css", "text/javascript")}
    if schema == "ndjson":
        return {"application/x-ndjson": {"schema": _STR}}
    if schema == "object":
        return {"application/json": {"schema": {"type": "object"}}}
    return {"application/json": {"schema": _ref(schema)}}


def _operation(route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": route.op, "summary": route.summary,
                          "responses": {}}
    if route.params:
        op["parameters"] = [
            {"name": p.name, "in": p.where, "required": p.required or p.where == "path",
             "description": p.description, "schema": p.schema()}
            for p in route.params
        ]
    if route.body:
        op["requestBody"] = {"required": True, "content": _content(route.body)}
    for status, schema in sorted(route.responses.items()):
        op["responses"][str(status)] = {"description": str(status), "content": _content(schema)}
    assert route.access is not None
    if route.access.scope != "public":
        op["security"] = [{next(iter(SECURITY_SCHEMES[route.role])): []}]
        op["x-stager-access"] = {"scope": route.access.scope, "on": route.access.on}
        for status in ("401", "403"):
            op["responses"].setdefault(status, {"description": status,
                                                "content": _content("Error")})
    if "500" not in op["responses"]:
        op["responses"]["500"] = {"description": "server error", "content": _content("Error")}
    return op


def openapi_document(role: str) -> dict[str, Any]:
    """The OpenAPI document of a ``"meta"`` or ``"data"`` server."""
    paths: dict[str, Any] = {}
    for route in routes_for(role):
        path = route.path.replace(":.*}", "}")
        paths.setdefault(path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": f"stager {role} server", "version": __version__},
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": SECURITY_SCHEMES[role]},
    }
