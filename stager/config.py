"""Configuration: one frozen object built from defaults ← file ← ``STAGER_*`` ← flags.

Every field has a default here.  A TOML file (``--config`` or ``STAGER_CONFIG``)
may set any field by name; so may the environment (``STAGER_CHUNK_SIZE=8MiB``);
command-line flags win over both.  The result is passed explicitly to whatever
needs it; nothing reads the environment behind its back.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .aio import LOOP_KINDS
from .errors import BadRequest

DEFAULT_META_URL = "http://127.0.0.1:7070"
MiB = 1 << 20
GiB = 1 << 30

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: str | int) -> int:
    """``"4MiB"`` → 4194304.  Binary units whether or not the ``i`` is written."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise BadRequest(f"not a size: {value!r}")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Config:
    # where the cluster is
    meta_url: str = DEFAULT_META_URL
    # servers
    host: str = "127.0.0.1"
    port: int = 7070
    advertise_url: str = ""          # URL other machines use; default http(s)://host:port
    root: str = ".stager"
    meta_store: str = ""             # metadata server: "" = SQLite under ROOT;
                                     # postgresql://USER@HOST:PORT/DB = PostgreSQL
    node: str = ""                   # node name of a data server; default: hostname
    target_id: str = ""              # stable id of a data server's target; default: generated once
    capacity: int = 0                # bytes a target offers; 0 = the file system's size
    # security (stager/auth/, docs/security.md)
    auth: bool = False               # servers: demand tokens (meta) and capabilities (data)
    insecure: bool = False           # servers: allow a non-loopback bind without auth
    token: str = ""                  # bearer token a client or a data server presents
    token_file: str = ""             # ... or a file holding it (STAGER_TOKEN_FILE)
    capability_ttl: float = 600.0    # metadata server: seconds a capability it mints lives
    auth_dir: str = ""               # metadata server: its signing key (default ROOT/auth)
    admin_token_file: str = ""       # ... and the bootstrap admin token (ROOT/admin.token)
    public_key_file: str = ""        # data server: the metadata server's public key
                                     # (default: fetched from it at start)
    tls_cert: str = ""               # servers: PEM certificate chain; with tls_key, HTTPS
    tls_key: str = ""                # servers: PEM private key
    ca_file: str = ""                # clients: CA bundle to trust (STAGER_CA_FILE)
    event_loop: str = "auto"         # "uvloop", "asyncio" or "auto": servers (per role) and
                                     # the client's I/O thread (stager/client/holder.py)
    # layout defaults
    chunk_size: int = 4 * MiB
    stripe_count: int = 0            # 0 = all healthy targets, at most max_stripe_count
    max_stripe_count: int = 8
    replicas: int = 1
    # limits
    max_chunk_size: int = 256 * MiB
    max_upload_size: int = 1 << 40   # whole-file PUT through the gateway
    max_json_body: int = 16 * MiB
    max_manifest_size: int = 256 * MiB
    manifest_cache_bytes: int = 256 * MiB  # metadata server: resolved manifests kept, gzip'd
    list_page_size: int = 1000
    # health
    heartbeat_interval: float = 2.0
    target_timeout: float = 10.0     # a target silent this long is marked down
    upload_grace: float = 3600.0     # abandoned uploads are collected after this
    multipart_idle: float = 86400.0  # an S3 multipart upload idle this long is collected
    multipart_min_part: int = 5 * MiB  # S3: every part of a multipart upload but the last
    gc_interval: float = 5.0
    # client
    client_concurrency: int = 16     # chunk requests in flight per client
    connections_per_target: int = 8
    readahead_chunks: int = 8
    connect_timeout: float = 5.0
    request_timeout: float = 60.0
    retries: int = 3
    stat_cache_ttl: float = 1.0
    failover_timeout: float = 1.0    # a replica silent this long (connect included) is left
                                     # for the next one; the last one tried gets request_timeout
    write_timeout: float = 10.0      # a chunk write unanswered this long (and its bytes at
                                     # 8 MiB/s) fails; the writer routes around the target
    write_retries: int = 6           # whole-write retries of in-memory data (pipe) with backoff
    # reliability (see stager/meta/upkeep/rebuild.py and fsck.py, stager/data/scrub.py)
    target_lost_after: float = 600.0  # a target down this long is lost: its chunks re-replicated
    rebuild_rate: int = 256 * MiB    # bytes/s copied by rebuild and repair; 0 = unlimited
    rebuild_concurrency: int = 4     # chunk copies in flight
    scrub_interval: float = 86400.0  # seconds between background scrub passes; 0 = off
    scrub_rate: int = 64 * MiB       # bytes/s a background scrub pass verifies; 0 = unlimited
    fsck_interval: float = 3600.0    # seconds between background fsck sweeps; 0 = off
    orphan_grace: float = 3600.0     # an unreferenced chunk is deleted once seen this long
    # the managed cache (stager/meta/cache/): attached directories' filled chunks
    cache_limit: int = 0             # filled bytes kept under this (0: no limit)
    cache_policy: str = "plan"       # eviction (stager/eviction.py): "plan" (furthest next
                                     # use by the registered Loader plans; LRU without
                                     # one), "lru", "s3fifo"
    cache_high: float = 0.95         # evict when filled bytes pass this share of the limit
    cache_low: float = 0.85          # ... down to this share
    cache_interval: float = 1.0      # seconds between looks at the filled bytes
    fill_concurrency: int = 16       # source reads in flight on one metadata server
    attach_sources: str = ""         # URL prefixes an attachment's source must start with,
                                     # comma-separated ("" = any): the hosts and buckets
                                     # the metadata server may be told to read
    # loader telemetry (stager/loader/report.py): loaders of a named job report to meta
    job: str = ""                    # job name Loaders report under ("" = no reports)
    report_interval: float = 5.0     # seconds between a Loader's telemetry reports
    loader_keep_freed: bool = True   # glibc: keep the memory a Loader's prefetch window
                                     # frees mapped for reuse (stager/loader/memory.py)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **_coerce(changes))

    def bearer_token(self) -> str | None:
        """The token to present: ``token``, else the contents of ``token_file``."""
        if self.token.strip():
            return self.token.strip()
        if self.token_file:
            try:
                text = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise BadRequest(f"cannot read the token file {self.token_file}: "
                                 f"{exc.strerror or exc}") from None
            if not text:
                raise BadRequest(f"the token file {self.token_file} is empty")
            return text
        return None

    def auth_headers(self) -> dict[str, str]:
        """``Authorization: Bearer`` with :meth:`bearer_token`, or nothing."""
        token = self.bearer_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def public_url(self) -> str:
        scheme = "https" if self.tls_cert and self.tls_key else "http"
        return self.advertise_url or f"{scheme}://{self.host}:{self.port}"


_FIELDS = {f.name: f for f in fields(Config)}
_CHOICES = {"event_loop": LOOP_KINDS, "cache_policy": ("plan", "lru", "s3fifo")}
_SIZE_FIELDS = {"chunk_size", "max_chunk_size", "max_upload_size", "max_json_body",
                "max_manifest_size", "manifest_cache_bytes", "capacity", "rebuild_rate",
                "scrub_rate", "cache_limit"}


def _coerce(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in values.items():
        if raw is None:
            continue
        if name not in _FIELDS:
            raise BadRequest(f"unknown configuration key: {name}")
        kind = type(getattr(Config(), name))
        try:
            if name in _SIZE_FIELDS:
                value: Any = parse_size(raw)
            elif kind is bool:
                value = raw if isinstance(raw, bool) else str(raw).lower() in {"1", "true", "yes"}
            else:
                value = kind(raw)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"bad value for {name}: {raw!r}") from exc
        if name in _CHOICES and value not in _CHOICES[name]:
            raise BadRequest(f"bad value for {name}: {raw!r} (one of {', '.join(_CHOICES[name])})")
        out[name] = value
    return out


def load_config(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    path: str | os.PathLike[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration: defaults ← file ← environment ← flags.

    ``defaults`` replaces built-in defaults for one role (a data server's port is 0).
    """
    env = os.environ if env is None else env
    layers: dict[str, Any] = dict(defaults or {})
    file_path = path or env.get("STAGER_CONFIG")
    if file_path:
        with open(Path(file_path), "rb") as fh:
            layers.update(tomllib.load(fh))
    for name in _FIELDS:
        key = "STAGER_" + name.upper()
        if key in env:
            layers[name] = env[key]
    for name, value in (flags or {}).items():
        if value is not None:
            layers[name] = value
    return Config(**_coerce(layers))
