"""``Client``: the blocking twin of :class:`AsyncClient`, made from it.

Coroutines run on the process's I/O thread, through the client the process
holder keeps for this ``Client`` (:mod:`.holder`, shared with the Loader and
the ``stager://`` filesystem).  A forked child gets its own I/O thread and
client on first use, so PyTorch DataLoader workers can use a ``Client`` made
before they were forked.
"""

from __future__ import annotations

import asyncio
import functools
import io
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fsspec.asyn import FSTimeoutError, sync

from ..config import Config
from .async_client import AsyncClient
from .cluster import Cluster
from .fileio import AsyncReadFile, AsyncWriteFile
from .holder import ProcessHolder, current, new_owner, release

MIRRORED = ("stat", "exists", "ls", "mkdir", "set_layout", "rename", "rm", "status",
            "targets", "cat", "read_into", "get", "put", "pipe", "put_manifest", "get_manifest",
            "remove_target", "forget_target", "scrub", "fsck", "write_many", "jobs", "create_token",
            "list_tokens", "revoke_token", "set_quota", "quotas", "pin", "unpin", "pins",
            "attach", "refresh", "detach", "attachments", "create_s3_key", "list_s3_keys")


class Client:
    """Blocking client; every method is the AsyncClient method of the same name."""

    def __init__(self, meta_url: str | Sequence[str] | None = None, *,
                 config: Config | None = None, token: str | None = None,
                 cluster: Cluster | None = None) -> None:
        self.cluster = Cluster.resolve(meta_url, config=config, token=token, cluster=cluster)
        self.config = self.cluster.config
        self._owner = new_owner()
        # (holder, loop, client) of the last call: a mirrored call takes them from here
        # while this process's holder is the one they came from (a forked child has
        # another) and close() has not dropped them
        self._kept: tuple[ProcessHolder, asyncio.AbstractEventLoop, AsyncClient] | None = None
        weakref.finalize(self, release, self._owner)    # forgotten without close()

    def _new_client(self) -> AsyncClient:
        return AsyncClient(cluster=self.cluster)

    @property
    def aio(self) -> AsyncClient:
        """The async client behind this one, in this process (a forked child makes its own)."""
        return current().client(self._owner, self.loop, self._new_client)

    @property
    def meta_url(self) -> str:
        return self.cluster.meta_url

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The I/O loop this client's coroutines run on (this process's)."""
        return current().io_loop(self.config.event_loop)

    def close(self) -> None:
        """Close this process's session; it is made again if the client is used again."""
        current().release(self._owner)
        self._kept = None

    def _there(self) -> tuple[asyncio.AbstractEventLoop, AsyncClient]:
        """:attr:`loop` and :attr:`aio`, kept from the call before where they still hold
        (two look-ups in the holder fewer on every call)."""
        holder = current()
        kept = self._kept
        if kept is None or kept[0] is not holder:
            kept = self._kept = (holder, self.loop, self.aio)
        return kept[1], kept[2]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def walk(self, path: str) -> list[Any]:
        async def collect() -> list[Any]:
            return [e async for e in self.aio.walk(path)]
        return sync(self.loop, collect)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> SyncReadFile | SyncWriteFile:
        f = sync(self.loop, self.aio.open, path, mode, **kwargs)
        if isinstance(f, AsyncReadFile):
            return SyncReadFile(self, f)
        return SyncWriteFile(self, f)


def run_there(loop: asyncio.AbstractEventLoop, func: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``'s coroutine run on ``loop`` (another thread's), waited
    for here: fsspec's ``sync`` as the mirrored methods use it, with less on the way.

    ``sync`` wraps the coroutine in a task of a runner coroutine, chains a
    ``concurrent.futures.Future`` to it and waits on a ``threading.Event`` (a
    condition: a lock and a waiter lock); a sync ``stat`` spent some 80 us in those
    hops besides the request itself.  Here the loop's thread runs the coroutine in a
    task of :func:`_finish`, which releases one raw lock this thread waits on as the
    coroutine ends, in the task's last step (a done callback would wait for one more
    turn of the loop).  What it raises is raised here as ``sync`` raises it (a timeout
    as fsspec's ``FSTimeoutError``); a ``timeout`` argument is ``sync``'s own, so such a
    call goes through ``sync``.
    """
    if "timeout" in kwargs or loop.is_closed():
        return sync(loop, func, *args, **kwargs)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:         # it would wait on itself: refused as fsspec's sync does
        raise NotImplementedError("Calling sync() from within a running loop")
    done = threading.Lock()
    done.acquire()
    box: list[Any] = []
    coro = func(*args, **kwargs)
    finish = _finish(coro, box, done)
    try:
        loop.call_soon_threadsafe(loop.create_task, finish)
    except RuntimeError:            # the loop closed meanwhile
        finish.close()
        coro.close()
        raise
    done.acquire()          # interruptible: Ctrl-C stops the wait, as sync's does
    if len(box) == 1:
        return box[0]
    exc = box[1]
    if isinstance(exc, asyncio.TimeoutError):
        raise FSTimeoutError from exc
    raise exc


async def _finish(coro: Coroutine[Any, Any, Any], box: list[Any],
                  done: threading.Lock) -> None:
    """Await ``coro``, put its result in ``box`` (``[result]``, or ``[None, exception]``
    when it raised or was cancelled) and release ``done``."""
    try:
        box.append(await coro)
    except BaseException as exc:     # cancelled too: the waiter raises CancelledError
        box[:] = [None, exc]
    finally:
        done.release()


def _mirror(name: str) -> Callable[..., Any]:
    method = getattr(AsyncClient, name)

    @functools.wraps(method)
    def blocking(self: Client, *args: Any, **kwargs: Any) -> Any:
        loop, aio = self._there()
        return run_there(loop, getattr(aio, name), *args, **kwargs)

    return blocking


for _name in MIRRORED:
    setattr(Client, _name, _mirror(_name))


class SyncReadFile(io.RawIOBase):
    """A readable, seekable binary file; reads block on the IO thread."""

    def __init__(self, client: Client, f: AsyncReadFile) -> None:
        super().__init__()
        self._client, self._f = client, f
        self.name = f.path
        self._lent = threading.Lock()     # a read's parts are lent until joined

    @property
    def size(self) -> int:
        return self._f.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, buffer: Any) -> int:
        return sync(self._client.loop, self._f.readinto, memoryview(buffer).cast("B"))

    def read(self, size: int = -1) -> bytes:
        # Joined on this thread: the copy overlaps the I/O thread's next reads, and
        # this thread's malloc arena keeps the memory of the reads before (the I/O
        # thread's returns it to the kernel: fresh pages faulted in every time).
        # One read at a time: the next refills the buffers of the parts before it.
        with self._lent:
            return b"".join(sync(self._client.loop, self._f.read_parts, size, reuse=True))

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            sync(self._client.loop, self._f.close)
        super().close()


class SyncWriteFile(io.RawIOBase):
    """A write-only binary file; the file appears when ``close`` returns."""

    def __init__(self, client: Client, f: AsyncWriteFile) -> None:
        super().__init__()
        self._client, self._f = client, f

    @property
    def info(self) -> Any:
        return self._f.info

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell()

    def write(self, data: Any) -> int:
        return sync(self._client.loop, self._f.write, memoryview(data).cast("B"))

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is not None:
            self.discard()
        self.close()

    def discard(self) -> None:
        if not self.closed:
            sync(self._client.loop, self._f.discard)
            super().close()

    def close(self) -> None:
        if not self.closed:
            try:
                sync(self._client.loop, self._f.close)
            finally:
                super().close()
