"""A client's capabilities: kept per file, fetched before they are needed.

With auth on, every chunk request to a data server carries a capability for
the file it touches (:mod:`stager.dataplane.credentials`).  The metadata server
hands one out with every stat (read) and every create or reroute (write), and
the book keeps them.  Whatever the book lacks, or holds with less than
:data:`MARGIN` seconds left, it fetches in one ``capabilities`` request for all
the files of the data request at hand, so a Loader that reads a million files
from a manifest asks for them a batch at a time, and one that runs for days
keeps working as each expires.

The ``capabilities`` route answers one *batch* capability for up to
:data:`~stager.auth.tokens.MAX_BATCH_FILES` of the files asked for, the same
text for each: a request carries each distinct text once, so a batch of small
files read together shows one or a few capabilities, not one per file.  A
Loader's :meth:`CapabilityBook.plan` asks for a fetch group's files together,
in an order that keeps each data server's files in few batches; when the
capabilities held for a group name few of its files each (a stat's, one per
file, or a shuffled epoch over many more batches than the group), it fetches the
group's anew rather than showing every data server all of them.

A data server that has verified a text keeps it, under a reference it computes
itself (:mod:`stager.auth.refs`).  The book remembers, per target, the texts a
request of it carried whole and that target then answered (:meth:`CapabilityBook.
accepted`), and shows that target ``ref1.<id>`` for them from then on: 24
characters, not a batch's ~7.6 KB.  A target that no longer holds one (it
restarted, or evicted it) answers 401 ``unknown_reference``; the data plane then
forgets that target's references (:meth:`CapabilityBook.forget_references`) and
sends the request again with the texts.

A write capability also reads the file it was issued for (a writer copies the
chunks it stored when it routes around a dead target).  Against a cluster with
auth off, the first answer says so (a null capability) and the book stops
asking.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence

from ..auth import expires_at
from ..auth.refs import PREFIX, reference
from ..auth.tokens import MAX_BATCH_FILES
from ..bounded import Bounded
from ..errors import StagerError
from ..protocol.authmsg import CapabilityRequest
from ..protocol.batch import read_results
from ..protocol.models import field_of
from ..protocol.routes import route

MARGIN = 120.0          # seconds: a capability closer than this to expiry is fetched anew
                        # (a quarter of its life, if that is less)
MAX_PER_REQUEST = 4096  # file ids per capabilities request (and per data request's header)
MAX_KEPT = 65536        # capabilities kept; the oldest learnt leave first (~20 MB at most)
SCATTERED = 4           # a plan's files per distinct capability held, on average, below
                        # which they are fetched anew: a data server is shown (and checks)
                        # each distinct one a request carries, so one per file or so (a
                        # stat's, or a shuffled epoch over far more batches than a window
                        # has files) is refetched as a few batches; a shuffled next epoch
                        # over some tens of batches keeps them (shown by reference they
                        # cost a request ~30 characters each and no new verification, where
                        # a refetch costs a signature and every data server a verification
                        # per batch)
MAX_HEADER = 256 * 1024     # characters of capabilities in one request: past this, the
                            # request's files are fetched anew as a few batches
MAX_REFS = 4096         # references remembered per target (a batch's names 256 files),
                        # the oldest accepted leaving first
MAX_TARGETS = 4096      # targets remembered; past this, all are forgotten

Request = Callable[..., Awaitable[object]]


class CapabilityBook:
    """The capabilities of one client; ``request`` is the metadata connection's."""

    def __init__(self, request: Request, clock: Callable[[], float] = time.time) -> None:
        self._request = request
        self.clock = clock
        # op → file → (text, when to fetch anew); op → file → its fetch under way.  Per
        # op, keyed by the file id alone: a Loader looks up every file of every request,
        # and a tuple built per file cost as much as the lookup
        self._caps: dict[str, dict[str, tuple[str, float]]] = {"read": {}, "write": {}}
        self._pending: dict[str, dict[str, asyncio.Future[None]]] = {"read": {}, "write": {}}
        self.off = False            # the cluster answered without capabilities: auth is off
        self.fetched = 0            # capabilities fetched (tests, telemetry)
        self.requests = 0           # capabilities requests sent, and their seconds
        self.fetch_seconds = 0.0
        # times a request (not a look-ahead) waited for capabilities, and how long: a
        # look-ahead that works keeps these at the first reads' (telemetry, tests)
        self.stalls = 0
        self.stalled = 0.0
        # target → the references it holds (it answered a request carrying their texts)
        self._accepted: dict[str, Bounded[str, None]] = {}
        self._ref_of: dict[str, str] = {}       # text → its reference, as computed

    async def close(self) -> None:
        """Cancel the fetches under way (the client is closing: one left running would
        open a new session to finish, and nothing would close it)."""
        fetches = {f for pending in self._pending.values() for f in pending.values()}
        for pending in self._pending.values():
            pending.clear()
        for fetch in fetches:
            fetch.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)

    def learn(self, op: str, file_id: str | None, text: str | None,
              renew: float | None = None) -> None:
        """Keep ``text``, the ``op`` capability for ``file_id`` an answer carried
        (``renew``: when to fetch it anew, if the caller worked it out already)."""
        if file_id is not None and text is not None:
            caps = self._held(op)
            caps.pop(file_id, None)                     # to the end: the newest
            caps[file_id] = (text, self._renew_at(text) if renew is None else renew)
            self._trim()

    def _trim(self) -> None:
        """Past :data:`MAX_KEPT` held, drop the oldest learnt quarter of each op's."""
        if sum(map(len, self._caps.values())) > MAX_KEPT:
            for kept in self._caps.values():
                for key in list(kept)[:len(kept) // 4 + 1]:
                    del kept[key]

    def _held(self, op: str) -> dict[str, tuple[str, float]]:
        caps = self._caps.get(op)
        if caps is None:
            caps = self._caps[op] = {}
            self._pending[op] = {}
        return caps

    def held(self, op: str, file_id: str) -> str | None:
        """The ``op`` capability held for ``file_id``, fresh or not (tests, telemetry)."""
        hit = self._caps.get(op, {}).get(file_id)
        return None if hit is None else hit[0]

    def _renew_at(self, text: str) -> float:
        expires = float(expires_at(text))
        return expires - min(MARGIN, max(0.0, expires - self.clock()) / 4)

    async def header(self, op: str, file_ids: Collection[str],
                     target: str | None = None) -> str | None:
        if self.off or op == "cluster" or not file_ids:
            return None
        texts, missing = self._lookup(op, file_ids)
        if missing:
            await self._fetch_missing(op, missing)
            texts, missing = self._lookup(op, file_ids)
        if sum(map(len, texts)) > MAX_HEADER:
            await self._fetch_missing(op, list(file_ids), anew=True)
            texts, missing = self._lookup(op, file_ids)
        if self.off or not texts:
            return None
        held = self._accepted.get(target) if target is not None else None
        if held:
            ref_of = self._ref_of
            for i, text in enumerate(texts):
                ref = ref_of.get(text)
                if ref is not None and ref in held:
                    texts[i] = ref
        return " ".join(texts)

    def accepted(self, target: str, value: str) -> None:
        """``target`` answered a request that showed it ``value`` (a header :meth:`header`
        made): it verified and holds the texts sent whole, so it is shown their
        references from now on."""
        held = None
        for item in value.split(" "):
            if item.startswith(PREFIX):
                continue
            ref = self._ref_of.get(item)
            if ref is None:
                if len(self._ref_of) >= MAX_KEPT:
                    self._ref_of.clear()
                ref = self._ref_of[item] = reference(item)
            if held is None:
                held = self._accepted.get(target)
                if held is None:
                    if len(self._accepted) >= MAX_TARGETS:
                        self._accepted.clear()
                    held = self._accepted[target] = Bounded(MAX_REFS)
            held.put(ref, None)

    def forget_references(self, target: str) -> None:
        """``target`` answered ``unknown_reference``: show it texts again."""
        self._accepted.pop(target, None)

    async def plan(self, op: str, file_ids: Sequence[str]) -> None:
        """Have the capabilities for ``op`` on ``file_ids`` (a plan's files read
        together, ordered so that each data server's lie together) at hand, in few
        batches: those held are kept unless they are spread over many more capabilities
        than a fetch of these files would make, each naming few of them
        (:data:`SCATTERED`), and then all are fetched anew.  Held in another order (a
        shuffled epoch's) they are kept: a data server checks the few a request shows
        it by reference, and has verified them already.  Waiting for them here is a
        stall (:attr:`stalls`): the requests that need them wait."""
        await self._wait(self._start_plan(op, file_ids))

    def ask(self, op: str, file_ids: Sequence[str]) -> list[asyncio.Future[None]]:
        """As :meth:`plan`, ahead of the requests that will need them, without waiting:
        the fetch is under way before the caller's next reads are (a request they then
        make waits for it; its failure is theirs to meet, asking again).  Returns the
        fetches they wait for."""
        return self._start_plan(op, file_ids)

    def _start_plan(self, op: str, file_ids: Sequence[str]) -> list[asyncio.Future[None]]:
        if self.off or op == "cluster" or not file_ids:
            return []
        texts, missing = self._lookup(op, file_ids)
        if len(texts) > 2 * (len(file_ids) // MAX_BATCH_FILES + 2) \
                and len(file_ids) < SCATTERED * len(texts):
            return self._start(op, list(file_ids), anew=True)
        return self._start(op, missing) if missing else []

    async def _fetch_missing(self, op: str, missing: list[str], anew: bool = False) -> None:
        await self._wait(self._start(op, missing, anew))

    def _start(self, op: str, missing: list[str], anew: bool = False
               ) -> list[asyncio.Future[None]]:
        """Fetch what no request under way is fetching already; return the fetches
        ``missing`` waits for: requests for other files run at once (a Loader's fetch
        groups in flight each ask for theirs), and a file is never asked for twice at
        the same time.  ``anew``: the files held too, but not those being fetched."""
        caps = self._held(op)
        pending = self._pending[op]
        waits = [pending[f] for f in missing if f in pending]
        mine = [f for f in dict.fromkeys(missing) if f not in pending]
        if anew:
            for f in mine:
                caps.pop(f, None)
        if mine:
            fetch = asyncio.ensure_future(self._fetch(op, mine))
            for f in mine:
                pending[f] = fetch

            def done(_: object) -> None:
                for f in mine:
                    pending.pop(f, None)
                if not fetch.cancelled():
                    fetch.exception()   # a look-ahead's failure: the reads ask again
            fetch.add_done_callback(done)
            waits.append(fetch)
        return waits

    async def _wait(self, waits: list[asyncio.Future[None]]) -> None:
        if not waits:
            return
        start = time.perf_counter()
        try:
            for fetch in set(waits):
                await asyncio.shield(fetch)     # a cancelled reader leaves the fetch to others
        finally:
            self.stalls += 1
            self.stalled += time.perf_counter() - start

    def _lookup(self, op: str, file_ids: Collection[str]) -> tuple[list[str], list[str]]:
        """The distinct capabilities held for ``file_ids`` (a batch's text once, however
        many of them it names), and the files with none fresh."""
        fresh = self.clock()
        caps = self._held(op)
        # Every file of a fetched batch shares its entry: the distinct entries are found
        # at C speed (``dict.fromkeys(map(...))``, in order), and only they are checked
        # for freshness.  The Loader looks up each file two or three times (look-ahead,
        # plan, request), and the loop below took 2 % of its CPU on 16 KiB files.
        entries = dict.fromkeys(map(caps.get, file_ids))
        if None not in entries and all(renew >= fresh for _, renew in entries):
            return list(dict.fromkeys(text for text, _ in entries)), []
        texts: dict[str, None] = {}
        missing = []
        writes = self._caps["write"] if op == "read" else None
        for file_id in file_ids:
            hit = caps.get(file_id)
            if (hit is None or hit[1] < fresh) and writes:
                hit = writes.get(file_id) or hit            # reading back a write
            if hit is None or hit[1] < fresh:
                missing.append(file_id)
            else:
                texts[hit[0]] = None
        return list(texts), missing

    async def _fetch(self, op: str, file_ids: Sequence[str]) -> None:
        for start in range(0, len(file_ids), MAX_PER_REQUEST):
            part = tuple(file_ids[start:start + MAX_PER_REQUEST])
            began = time.perf_counter()
            answer = await self._request(route("capabilities"),
                                         body=CapabilityRequest(op, part).to_json())
            self.requests += 1
            self.fetch_seconds += time.perf_counter() - began
            results = read_results(answer, _item)
            if not any(isinstance(got, str) for got in results):
                if None in results:     # null throughout: auth is off
                    self.off = True
                    return
            entry, caps, learnt = None, self._held(op), 0
            for file_id, got in zip(part, results, strict=True):
                if isinstance(got, StagerError):
                    continue            # no such file: the data server will say 401/403
                if got is not None:     # a batch's text comes once: null is the one before
                    entry = (got, self._renew_at(got))      # one entry, shared (_lookup)
                if entry is not None:   # as learn(), the trim once for the whole answer
                    caps.pop(file_id, None)
                    caps[file_id] = entry
                    learnt += 1
            self.fetched += learnt
            self._trim()


def _item(obj: object) -> str | None:
    return field_of(obj, "capability", str, None)   # type: ignore[arg-type]
