"""The SQLite store's one thread, with group commit.

SQLite calls are blocking and the connection takes one caller at a time, so all
calls run in order on one thread and the event loop never waits on SQLite or on
an fsync.  Calls made with :meth:`StoreThread.write` that queued up while the
thread was busy run together inside one transaction (``group()``):
one commit, one fsync, for all of them.  Each still fails alone (its own
transaction nests as a savepoint), and every caller is answered only after the
shared commit, so an acknowledged write is durable exactly as before.  A read
(:meth:`StoreThread.run`) ends a group: calls never change order.

The calls one pass of the event loop makes reach the thread as one hand-off (the
pass's last step queues them together): the record of a small PUT's upload and its
commit, made by two tasks one after the other (stager/meta/http/gateway.py), share
one wake-up and one transaction every time, not only when the thread was still
busy when the second came (about every other PUT before).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
MAX_GROUP = 256          # calls per shared transaction
Lead = tuple[str, Any]
Follow = tuple[str, Callable[[Any], Callable[[], Any]]]


@dataclass
class _Call:
    fn: Callable[[], Any]
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    outcome: tuple[bool, Any] = field(default=(False, None))
    lead: Lead | None = None        # (key, value): a follow of the same key joins it
    follow: Follow | None = None    # (key, the joined call made from the lead's value)

    def execute(self) -> None:
        try:
            self.outcome = (True, self.fn())
        except BaseException as exc:     # delivered to the caller, whatever it is
            self.outcome = (False, exc)

    def answer(self) -> None:
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, self.outcome)
        except RuntimeError:
            pass                 # the caller's loop is closed: nobody is waiting


class _Joined:
    """A lead and the call that followed it with its key, run as one call (the joined
    function, made from the lead's value): both are answered with its outcome, the
    lead with None where it went through (a small PUT's upload record and commit:
    SQLiteStore.put_upload)."""

    write = True

    def __init__(self, lead: _Call, follow: _Call) -> None:
        self.lead, self.follow = lead, follow

    def execute(self) -> None:
        assert self.lead.lead is not None and self.follow.follow is not None
        self.follow.fn = self.follow.follow[1](self.lead.lead[1])
        self.follow.execute()
        self.lead.outcome = (True, None) if self.follow.outcome[0] else self.follow.outcome

    @property
    def outcome(self) -> tuple[bool, Any]:
        return self.follow.outcome

    @outcome.setter
    def outcome(self, value: tuple[bool, Any]) -> None:
        self.lead.outcome = self.follow.outcome = value

    def answer(self) -> None:
        self.lead.answer()
        self.follow.answer()


def _join(group: list[Any]) -> list[Any]:
    """``group`` with each lead that the next call follows (same key) joined to it."""
    out: list[Any] = []
    for call in group:
        prev = out[-1] if out else None
        if (call.follow is not None and isinstance(prev, _Call) and prev.lead is not None
                and prev.lead[0] == call.follow[0]):
            out[-1] = _Joined(prev, call)
        else:
            out.append(call)
    return out


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():            # the caller went away (cancelled)
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


_STOP = object()


class StoreThread:
    """Runs blocking calls one at a time on its own thread; ``group()`` opens the one
    transaction that queued writes share (each call's own nests inside it)."""

    def __init__(self, group: Callable[[], AbstractContextManager[object]], *,
                 max_group: int = MAX_GROUP) -> None:
        self.group = group
        self.max_group = max_group
        self.groups = 0              # shared transactions run (for tests and metrics)
        self.grouped_calls = 0       # calls that ran inside one
        self.joined = 0              # leads run joined with the call that followed them
        self.handoffs = 0            # items taken from the queue: each one wake-up, at most
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # per loop: the calls of its pass under way, queued together at the pass's end
        self._outbox: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="meta-store", daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` on the store thread, alone."""
        return await self._submit(lambda: fn(*args, **kwargs), write=False)

    async def write(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Like :meth:`run`, but may share one transaction with other writes."""
        return await self._submit(lambda: fn(*args, **kwargs), write=True)

    async def write_as(self, lead: Lead | None, follow: Follow | None,
                       fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """:meth:`write`; a call with ``lead`` (key, value) right before one with
        ``follow`` (the same key, a function of that value) in the queue run as one:
        that function's call, whose outcome answers both (see :class:`_Joined`)."""
        return await self._submit(lambda: fn(*args, **kwargs), write=True,
                                  lead=lead, follow=follow)

    async def _submit(self, fn: Callable[[], Any], *, write: bool, lead: Lead | None = None,
                      follow: Follow | None = None) -> Any:
        if self._closed:
            raise RuntimeError("the metadata store is closed")
        loop = asyncio.get_running_loop()
        call = _Call(fn, write, loop, loop.create_future(), lead=lead, follow=follow)
        outbox = self._outbox.get(loop)
        if outbox is None:
            outbox = self._outbox[loop] = []
            loop.call_soon(self._flush, loop)
        outbox.append(call)
        return await call.future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Queue the calls ``loop``'s pass made, as one item (in their order)."""
        calls = self._outbox.pop(loop, None)
        if calls:
            self._queue.put(calls)

    def close(self) -> None:
        """Finish every call already queued, then stop the thread."""
        if not self._closed:
            self._closed = True
            # calls made on a loop since its last pass ended: they run before the stop
            # (a flush still scheduled on that loop then finds nothing)
            for loop in list(self._outbox):
                self._flush(loop)
            self._queue.put(_STOP)
            self._thread.join()

    # -- the thread ----------------------------------------------------------------
    def _work(self) -> None:
        pending: deque[Any] = deque()
        while True:
            if not pending:
                self._add(pending, self._queue.get())
            self._take_queued(pending)
            head = pending.popleft()
            if head is _STOP:
                self._refuse(pending)
                return
            group = [head]
            while (head.write and pending and len(group) < self.max_group
                   and isinstance(pending[0], _Call) and pending[0].write):
                group.append(pending.popleft())
            self._execute(_join(group))

    def _take_queued(self, pending: deque[Any]) -> None:
        """Move everything queued so far to ``pending``, without waiting."""
        while True:
            try:
                self._add(pending, self._queue.get_nowait())
            except queue.Empty:
                return

    def _add(self, pending: deque[Any], item: Any) -> None:
        """One item of the queue (a pass's calls, or the stop) into ``pending``."""
        self.handoffs += 1
        if isinstance(item, list):
            pending.extend(item)
        else:
            pending.append(item)

    def _refuse(self, pending: deque[Any]) -> None:
        """Answer calls that raced with close() instead of leaving them waiting."""
        self._take_queued(pending)
        for call in pending:
            if isinstance(call, _Call):
                call.outcome = (False, RuntimeError("the metadata store is closed"))
                call.answer()

    def _execute(self, group: list[Any]) -> None:
        if len(group) == 1:
            group[0].execute()
            if isinstance(group[0], _Joined):       # two calls, one transaction
                self.joined += 1
                self.groups += 1
                self.grouped_calls += 2
            group[0].answer()
            return
        try:
            with self.group():
                for call in group:
                    call.execute()
        except BaseException as exc:     # the shared commit failed: none of it is durable
            for call in group:
                call.outcome = (False, exc)
        else:
            self.groups += 1
            self.grouped_calls += sum(2 if isinstance(c, _Joined) else 1 for c in group)
            self.joined += sum(isinstance(c, _Joined) for c in group)
        for call in group:
            call.answer()
