"""Group commit for the PostgreSQL store: writes queued meanwhile share one transaction.

While one group's transaction runs, the writes that arrive queue up; the next
group takes them all (up to ``max_group``) into one SERIALIZABLE transaction,
so that each fails alone, exactly as the SQLite store's thread groups them
(:mod:`.sqlite.thread`): a write that fails with our error has changed nothing, and
one that fails with a database error has the group run again, each write in a
savepoint.  One COMMIT, one WAL flush,
for all of them; every caller is answered only after it.  Groups run one at a
time, so the writes of one metadata server never conflict with each other (a
group commit in one directory would otherwise have every transaction update the
same parent row); a conflict with anything else runs the whole group again.

A write may name itself a ``lead`` (a key and a value) and the one queued right
behind it a ``follow`` of the same key: the two then run as the one statement the
follower makes of the lead's value (a small file's upload record and its commit,
queued together by the gateway: one round trip instead of two).  Both callers get
its outcome: the lead ``None``, the follower its result; both its error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from ....errors import StagerError
from .db import Database, Op, must_abort

MAX_GROUP = 256          # writes per shared transaction


@dataclass
class _Call:
    op: Op[Any]
    future: asyncio.Future[Any]
    alone: Op[Any] | None = None     # run instead when alone, without a transaction
    rerun: bool = True               # ... and again after a lost connection
    lead: tuple[object, Any] | None = None      # (key, value) a follower may take in
    follow: tuple[object, Callable[[Any], Op[Any]]] | None = None   # (key, joined op)
    led: asyncio.Future[Any] | None = None      # a joined lead's caller, answered None


class WriteGroups:
    def __init__(self, db: Database, *, max_group: int = MAX_GROUP) -> None:
        self.db = db
        self.max_group = max_group
        self.groups = 0              # shared transactions of more than one write
        self.grouped_calls = 0       # writes that ran inside one
        self.redone = 0              # groups run again with savepoints (a database error)
        self.joined = 0              # leads run as one statement with their follower
        self._queue: deque[_Call] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    async def write(self, op: Op[Any], *, alone: Op[Any] | None = None,
                    rerun: bool = True, lead: tuple[object, Any] | None = None,
                    follow: tuple[object, Callable[[Any], Op[Any]]] | None = None) -> Any:
        """``op(conn)`` in a transaction it may share with the writes queued alongside.
        ``alone``, where given, does the same as one statement that needs no transaction
        (see :meth:`.Database.statement`, whose ``rerun`` it is): it runs instead when
        nothing else is queued, a round trip instead of three (BEGIN, op, COMMIT).
        ``lead`` and ``follow``: see the module's docstring."""
        if self._closed:
            raise RuntimeError("the metadata store is closed")
        call = _Call(op, asyncio.get_running_loop().create_future(), alone, rerun, lead,
                     follow)
        self._queue.append(call)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        return await call.future

    async def drain(self) -> None:
        """Stop taking writes; finish those queued."""
        self._closed = True
        if self._worker is not None:
            await asyncio.shield(self._worker)

    def cancel(self) -> None:
        """Stop now: queued writes are refused (nothing of them was sent)."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
        while self._queue:
            call = self._queue.popleft()
            if not call.future.done():
                call.future.set_exception(RuntimeError("the metadata store is closed"))

    async def _work(self) -> None:
        while self._queue:
            group = [self._queue.popleft()
                     for _ in range(min(len(self._queue), self.max_group))]
            waiting = [c for c in group if not c.future.done()]    # callers gone
            group = _joined(waiting)
            self.joined += len(waiting) - len(group)
            if group:
                await self._run(group)

    async def _run(self, group: list[_Call]) -> None:
        try:
            if len(group) == 1 and group[0].alone is not None:
                outcomes = [(True, await self.db.statement(group[0].alone,
                                                           rerun=group[0].rerun))]
            elif len(group) == 1:
                outcomes = [(True, await self.db.write(group[0].op))]
            else:
                outcomes = await self._shared(group)
                self.groups += 1
                self.grouped_calls += len(group)
        except asyncio.CancelledError:
            outcomes = [(False, RuntimeError("the metadata store is closed"))] * len(group)
            self._answer(group, outcomes)
            raise
        except Exception as exc:       # the transaction failed: none of it happened
            outcomes = [(False, exc)] * len(group)
        self._answer(group, outcomes)

    async def _shared(self, group: list[_Call]) -> list[tuple[bool, Any]]:
        try:
            return list(await self.db.write(lambda conn: _each(conn, group)))
        except _Redo:
            self.redone += 1
            return list(await self.db.write(lambda conn: _each_saved(conn, group)))

    @staticmethod
    def _answer(group: list[_Call], outcomes: list[tuple[bool, Any]]) -> None:
        for call, (ok, value) in zip(group, outcomes, strict=True):
            for future, result in ((call.led, None), (call.future, value)):
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(result)
                else:
                    future.set_exception(value)


def _joined(group: list[_Call]) -> list[_Call]:
    """``group`` with each lead and the follower of its key right behind it made one
    call: the follower's statement of the lead's value, answering both (never run again
    after a lost connection: the follower's commit may have happened)."""
    out: list[_Call] = []
    for call in group:
        last = out[-1] if out else None
        if (call.follow is not None and last is not None and last.lead is not None
                and last.led is None and last.lead[0] == call.follow[0]):
            op = call.follow[1](last.lead[1])
            out[-1] = _Call(op, call.future, alone=op, rerun=False, led=last.future)
        else:
            out.append(call)
    return out


class _Redo(Exception):
    """A write of the group failed with a database error, which aborts the whole
    transaction: run the group again, each write in a savepoint."""


async def _each(conn: asyncpg.Connection, group: list[_Call]) -> list[tuple[bool, Any]]:
    """Each write in turn, without savepoints: a write either succeeds, or raises one of
    our errors having changed nothing (the store's writes are written so: their checks
    come before their changes), or raises a database error, which aborts the
    transaction -- then the group runs again with :func:`_each_saved`."""
    outcomes: list[tuple[bool, Any]] = []
    for call in group:
        try:
            outcomes.append((True, await call.op(conn)))
        except StagerError as exc:
            outcomes.append((False, exc))
        except Exception as exc:
            if must_abort(exc, conn):
                raise
            raise _Redo() from exc
    return outcomes


async def _each_saved(conn: asyncpg.Connection, group: list[_Call]
                      ) -> list[tuple[bool, Any]]:
    """Each write in a savepoint: one that fails (not the whole transaction) fails alone.
    Releasing one savepoint and taking the next is one round trip."""
    outcomes: list[tuple[bool, Any]] = []
    await conn.execute("SAVEPOINT grouped")
    for i, call in enumerate(group):
        try:
            outcomes.append((True, await call.op(conn)))
        except Exception as exc:
            if must_abort(exc, conn):
                raise
            await conn.execute("ROLLBACK TO SAVEPOINT grouped")     # it stays, for the next
            outcomes.append((False, exc))
            continue
        if i < len(group) - 1:
            await conn.execute("RELEASE SAVEPOINT grouped; SAVEPOINT grouped")
    return outcomes
