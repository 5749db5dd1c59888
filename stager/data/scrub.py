"""The scrubber: re-reads every chunk of a target and checks its CRC32Cs.

A background pass runs every ``scrub_interval`` seconds at most ``scrub_rate``
bytes/s, so it never competes hard with training reads.  Chunks a read found
corrupt (see :func:`stager.data.maintenance.suspect_middleware`) are checked at
once, without waiting for the next pass.  Corrupt chunks are reported to the
metadata server (the ``scrub_report`` route), which copies a good replica over
them; reports that fail are kept and sent again.  A corrupt chunk is left in
place, never deleted here: when every replica is bad, readers must still get a
clear ``CorruptChunk`` rather than a missing chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from ..aio import wait_for_wake
from ..auth.tls import client_ssl
from ..config import Config
from ..errors import TRANSPORT_FAILURES, CorruptChunk, StagerError, error_from_wire
from ..protocol.messages import ScrubProgress, ScrubReport
from ..protocol.metaurls import meta_urls
from ..protocol.routes import route
from ..ratelimit import TokenBucket
from ..storage import ChunkStore

log = logging.getLogger("stager.scrub")
Progress = Callable[[int, int], Awaitable[None]]
PROGRESS_EVERY = 1.0         # seconds between progress callbacks
REPORT_RETRY = 5.0           # seconds between attempts to report corrupt chunks


@dataclass
class ScrubResult:
    checked: int = 0
    bytes: int = 0
    corrupt: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "bytes": self.bytes, "corrupt": self.corrupt,
                "seconds": round(self.seconds, 3)}


def _check(store: ChunkStore, name: str) -> tuple[bool, int]:
    """(good, bytes on disk) of one chunk; an unreadable chunk counts as corrupt."""
    try:
        return True, store.verify(name).file_size
    except CorruptChunk:
        pass
    except FileNotFoundError:
        return True, 0              # deleted meanwhile: nothing to check
    except OSError as exc:
        log.warning("chunk %s unreadable: %s", name, exc)
    try:
        return False, os.stat(store.path_of(name)).st_size
    except OSError:
        return False, 0


class Scrubber:
    """Verifies the chunks of one target; one pass at a time."""

    def __init__(self, store: ChunkStore, target_id: str, config: Config,
                 auth_headers: Callable[[], dict[str, str]] | None = None) -> None:
        self.store = store
        self.target_id = target_id
        self.config = config
        self.auth_headers = auth_headers or config.auth_headers     # the target's credential
        self.passes = 0
        self.corrupt_found = 0
        self.last_pass: ScrubResult | None = None
        self.progress = ScrubProgress()     # of full passes: heartbeats carry it
        self._lock = asyncio.Lock()
        self._suspects: set[str] = set()
        self._unreported: set[str] = set()
        self._wake = asyncio.Event()

    def suspect(self, chunk: str) -> None:
        """A read found ``chunk`` corrupt: check (and report) it soon."""
        self._suspects.add(chunk)
        self._wake.set()

    async def verify(self, names: Iterable[str], *, rate: int = 0,
                     progress: Progress | None = None, tally: bool = False) -> ScrubResult:
        """Check ``names`` at most ``rate`` bytes/s (0: as fast as the disk goes);
        ``tally``: count each chunk in :attr:`progress` (a full pass)."""
        async with self._lock:
            result = ScrubResult()
            bucket = TokenBucket(rate)
            start = last = time.monotonic()
            for name in names:
                good, size = await asyncio.to_thread(_check, self.store, name)
                result.checked += 1
                result.bytes += size
                if not good:
                    result.corrupt.append(name)
                    self.corrupt_found += 1
                if tally:
                    self.progress = replace(self.progress, chunks_done=result.checked,
                                            bytes_done=result.bytes,
                                            corrupt_found=self.corrupt_found)
                await bucket.take(size)
                if progress is not None and time.monotonic() - last >= PROGRESS_EVERY:
                    last = time.monotonic()
                    await progress(result.checked, result.bytes)
            result.seconds = time.monotonic() - start
            return result

    async def full_pass(self, *, rate: int = 0, progress: Progress | None = None
                        ) -> ScrubResult:
        names = await asyncio.to_thread(self.store.list_chunks)
        used = (await asyncio.to_thread(self.store.usage)).used
        self.progress = replace(self.progress, state="running", chunks_done=0, bytes_done=0,
                                chunks_total=len(names), bytes_total=used,
                                started=time.time(), finished=0.0)
        try:
            result = await self.verify(names, rate=rate, progress=progress, tally=True)
        finally:
            self.progress = replace(self.progress, state="idle", finished=time.time())
        self.passes += 1
        self.last_pass = result
        # what the pass found on disk is the pass's size (the start's was an estimate)
        self.progress = replace(self.progress, passes=self.passes, bytes_total=result.bytes,
                                chunks_total=result.checked)
        if result.corrupt:
            log.warning("scrub of %s: %d of %d chunks corrupt: %s", self.target_id,
                        len(result.corrupt), result.checked, result.corrupt[:10])
        return result

    async def run(self) -> None:
        """Background passes and suspect checks, reporting what is corrupt, forever."""
        interval = self.config.scrub_interval
        next_pass = time.monotonic() + interval
        while True:
            wait = max(0.0, next_pass - time.monotonic())
            if self._unreported:
                wait = min(wait, REPORT_RETRY)
            await wait_for_wake(self._wake, wait)
            try:
                if self._suspects:
                    names, self._suspects = sorted(self._suspects), set()
                    self._unreported.update((await self.verify(names)).corrupt)
                if time.monotonic() >= next_pass:
                    next_pass = time.monotonic() + interval
                    self._unreported.update(
                        (await self.full_pass(rate=self.config.scrub_rate)).corrupt)
                if self._unreported:
                    await self._report()
            except (*TRANSPORT_FAILURES, StagerError) as exc:
                log.warning("scrub report to %s failed, will retry: %s",
                            self.config.meta_url, exc)
            except Exception:
                log.exception("scrub of %s failed; will try again", self.target_id)

    async def _report(self) -> None:
        chunks = sorted(self._unreported)
        body = json.dumps(ScrubReport(self.target_id, tuple(chunks)).to_json())
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(ssl=client_ssl(self.config.ca_file))
        urls = meta_urls(self.config.meta_url)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            for i, meta in enumerate(urls):     # the first metadata server that answers
                try:
                    async with session.post(route("scrub_report").url(meta), data=body,
                                            headers={"Content-Type": "application/json",
                                                     **self.auth_headers()}) as resp:
                        if resp.status >= 400:
                            raise error_from_wire(resp.status, await resp.read())
                    break
                except TRANSPORT_FAILURES:
                    if i + 1 == len(urls):
                        raise
        self._unreported.difference_update(chunks)
        log.info("reported %d corrupt chunk(s) of %s", len(chunks), self.target_id)
