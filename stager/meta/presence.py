"""Which metadata servers serve a store, and whether each is alive.

An operator with two metadata servers, one of them dead, must see it: ``stager
status`` and the dashboard list every server of the store (``Status.metas``).
And ``stager meta migrate`` must not copy a store a server is still writing to.

* A SQLite store has one server.  It holds an exclusive ``flock`` on
  ``meta.lock`` beside ``meta.sqlite3`` (``ROOT/meta.lock``) for as long as it
  runs; the kernel drops the lock when the process dies, however it dies.  It
  lists itself.
* On a shared store (PostgreSQL) each server records itself in the shared state
  every ``heartbeat_interval`` (``meta/URL``: its store, whether it holds the
  duties, when it was last seen) and reads every record back.  A server not seen
  for :data:`DOWN_AFTER` intervals (at least ``target_timeout``) is down; one
  that stops cleanly says so and is down at once.  Records not seen for
  :data:`FORGET_AFTER` seconds are dropped (a server on port 0 gets a new URL each
  start).  The duties themselves stay PostgreSQL's advisory lock
  (:meth:`~.store.servers.SharedState.hold_duties`); a record only says who held it last.

The clock is each server's own: records from machines whose clocks differ by more
than the down interval would look down; keep the metadata servers' clocks in step
(NTP), as the heartbeats of the targets already need.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from ..aio import cancel_and_wait, keep_doing
from ..config import Config
from ..errors import StagerError
from ..protocol.cluster import MetaServer
from .service import MetaService
from .store.servers import SharedState

log = logging.getLogger("stager.meta")

LOCK_FILE = "meta.lock"
PREFIX = "meta/"
DOWN_AFTER = 3                 # intervals without a record: down
FORGET_AFTER = 86400.0         # seconds without a record: no longer listed


def lock_path(sqlite_file: str | os.PathLike[str]) -> Path:
    """The lock a metadata server holds while it serves the SQLite file."""
    return Path(sqlite_file).parent / LOCK_FILE


def hold_lock(path: Path) -> int | None:
    """Take the exclusive lock at ``path``: its file descriptor, or ``None`` when
    another process holds it (a second server on one root: logged, not refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def lock_holder(path: Path) -> str | None:
    """Whether a running server holds the lock at ``path``: its pid (as it wrote
    it), or ``None`` when nobody does (no file, or a lock nobody holds)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 64).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def store_name(config: Config) -> str:
    """The store as an operator names it, without a password."""
    if not config.meta_store:
        return f"sqlite:{Path(config.root) / 'meta.sqlite3'}"
    parts = urlsplit(config.meta_store)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def down_after(config: Config) -> float:
    """Seconds without a record after which a metadata server is down."""
    return max(DOWN_AFTER * config.heartbeat_interval, config.target_timeout)


def judge(records: Mapping[str, Mapping[str, Any]], now: float, silent: float
          ) -> list[MetaServer]:
    """The servers ``records`` (the shared state under ``meta/``) describe, by URL:
    down when stopped or not seen for ``silent`` seconds."""
    out = []
    for body in records.values():
        seen = float(body.get("seen", 0.0))
        up = not body.get("stopped") and now - seen <= silent
        out.append(MetaServer(url=str(body.get("url", "")), store=str(body.get("store", "")),
                              state="up" if up else "down",
                              duties=bool(body.get("duties")) and up, last_seen=seen))
    return sorted(out, key=lambda m: m.url)


async def live_servers(store: SharedState, silent: float, now: float) -> list[MetaServer]:
    """The servers a shared store's records say are up now."""
    return [m for m in judge(await store.get_states(PREFIX), now, silent) if m.state == "up"]


class Presence:
    """This server's record, and the list of its store's servers for ``status``."""

    def __init__(self, service: MetaService, config: Config) -> None:
        self.service = service
        self.config = config
        self.url = config.public_url      # until the bound address is known (serving)
        self.store = store_name(config)
        self.records: dict[str, dict[str, Any]] = {}

    def listing(self) -> list[MetaServer]:
        """Every server of the store; this one up, with the duties it holds now."""
        now = self.service.clock()
        me = MetaServer(url=self.url, store=self.store, state="up",
                        duties=self.service.duties_held, last_seen=now)
        others = [m for m in judge(self.records, now, down_after(self.config))
                  if m.url != self.url]
        return sorted([me, *others], key=lambda m: m.url)

    async def serving(self, url: str) -> None:
        """The server is listening at ``url`` (``serve``'s ``after_bind``)."""
        self.url = url
        if self.service.store.shared:
            await self.record()

    async def record(self, *, stopped: bool = False) -> None:
        """Store this server's record; read every server's back."""
        store = self.service.store
        now = self.service.clock()
        await store.put_state(PREFIX + self.url, {
            "url": self.url, "store": self.store, "seen": now, "pid": os.getpid(),
            "duties": self.service.duties_held and not stopped, "stopped": stopped})
        records = await store.get_states(PREFIX)
        for key, body in list(records.items()):
            if now - float(body.get("seen", 0.0)) > FORGET_AFTER:
                await store.put_state(key, None)
                del records[key]
        self.records = records


PRESENCE = web.AppKey("presence", Presence)


def announcer(app: web.Application) -> Callable[[str], Coroutine[Any, Any, None]]:
    """The ``after_bind`` of :func:`stager.web.server.serve` for a metadata app."""
    return app[PRESENCE].serving


def install(app: web.Application, service: MetaService, config: Config) -> Presence:
    """Hold the SQLite lock, or keep this server's record in a shared store, while
    ``app`` runs; ``status`` lists the servers (after the context that starts the
    service: its store must still be open when this one stops)."""
    presence = Presence(service, config)
    app[PRESENCE] = presence
    service.meta_servers = presence.listing

    async def loop() -> None:
        await keep_doing(presence.record, config.heartbeat_interval,
                         "recording this metadata server", log, wait_first=True)

    async def running(app: web.Application) -> AsyncIterator[None]:
        if not service.store.shared:
            lock = lock_path(Path(config.root) / "meta.sqlite3")
            fd = hold_lock(lock)
            if fd is None:
                log.warning("another process holds %s: two metadata servers on one "
                            "SQLite store", lock)
            try:
                yield
            finally:
                if fd is not None:
                    os.close(fd)
            return
        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            await cancel_and_wait([task])
            with contextlib.suppress(StagerError, OSError):
                await presence.record(stopped=True)

    app.cleanup_ctx.append(running)
    return presence
