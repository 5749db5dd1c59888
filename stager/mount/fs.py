"""The FUSE operations of ``stager mount`` (pyfuse3's low-level API, asyncio mode).

Every operation is a coroutine on the one event loop that also runs the
:class:`~stager.client.AsyncClient`, so a request waiting on the network never
blocks another.  Errors become errno values in one place (:func:`fuse_op`,
through :func:`stager.errors.errno_of`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import json
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pyfuse3

from ..client import AsyncClient
from ..errors import NotADirectory, NotFound, StagerError, errno_of
from ..protocol import paths
from ..protocol.models import FileInfo
from .buffers import BufferPool
from .cache import ChunkCache, cache_slots
from .handles import DirHandle, ReadHandle, WriteHandle, unsupported
from .inodes import InodeTable, Node, identity
from .options import MountOptions

log = logging.getLogger("stager.mount")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
STATS_XATTR = b"user.stager.stats"
RELEASE_WAIT = 5.0       # seconds an open waits for the release of a closed writer
Handle = ReadHandle | WriteHandle | DirHandle


def fuse_op(fn: F) -> F:
    """Run an operation; answer the kernel with an errno when it fails."""
    @functools.wraps(fn)
    async def run(self: StagerFS, *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError as exc:
            self.stats["errors"][errno.errorcode.get(exc.errno, str(exc.errno))] += 1
            raise
        except (StagerError, OSError) as exc:
            code = errno_of(exc)
            log.debug("%s%r: %s (%s)", fn.__name__, args[:2], exc, errno.errorcode.get(code))
        except Exception:
            log.exception("%s%r failed", fn.__name__, args[:2])
            code = errno.EIO
        self.stats["errors"][errno.errorcode.get(code, str(code))] += 1
        raise pyfuse3.FUSEError(code) from None
    return run  # type: ignore[return-value]


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


def _name(raw: bytes, *, missing: int = errno.EINVAL) -> str:
    """Names in stager are UTF-8; any other name cannot exist there."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(missing) from None


class StagerFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, client: AsyncClient, root: FileInfo, options: MountOptions) -> None:
        super().__init__()
        self.client = client
        self.options = options
        self.table = InodeTable(root)
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1
        self.uid, self.gid = os.getuid(), os.getgid()
        self._statfs: tuple[float, pyfuse3.StatvfsData] | None = None
        self.stats: dict[str, Any] = {"read_requests": 0, "read_bytes": 0, "max_read": 0,
                                      "write_requests": 0, "write_bytes": 0, "max_write": 0,
                                      "errors": Counter()}
        self.cache_stats: Counter[str] = Counter()   # chunks_fetched, ranged_reads, ...
        # As many buffers as one file read front to back holds, so that the next
        # file opened starts without allocating (see BufferPool).
        self.buffers = BufferPool(cache_slots(options.readahead_chunks)
                                  * client.config.chunk_size)
        self.on_init: Callable[[], None] | None = None

    def init(self) -> None:
        # The kernel applies its answer to INIT (readahead included) after this
        # returns; whatever must come later runs on the next turn of the loop.
        if self.on_init is not None:
            asyncio.get_running_loop().call_soon(self.on_init)

    # -- helpers -------------------------------------------------------------------
    def _node(self, ino: int) -> Node:
        node = self.table.get(ino)
        if node is None:
            raise _fail(errno.ESTALE)
        return node

    def _add(self, handle: Handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = handle
        return fh

    def _writable(self) -> None:
        if self.options.read_only:
            raise _fail(errno.EROFS)

    def attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        info = node.info
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        perm = 0o555 if self.options.read_only else 0o755
        if info.is_dir:
            a.st_mode, a.st_nlink, a.st_size, a.st_blksize = stat.S_IFDIR | perm, 2, 0, 4096
        else:
            size = node.upload.pos if node.upload is not None else info.size
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | (perm & 0o644), 1, size
            a.st_blksize = info.layout.chunk_size if info.layout else 1 << 20
        a.st_blocks = -(-a.st_size // 512)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = int(info.mtime * 1e9)
        a.st_uid, a.st_gid = self.uid, self.gid
        # While a version is being written the kernel must ask again each time:
        # a version that fails is never committed and must vanish at once.
        writing = node.upload is not None
        a.attr_timeout = 0 if writing else self.options.attr_timeout
        a.entry_timeout = 0 if writing else self.options.entry_timeout
        return a

    # -- names and attributes -----------------------------------------------------------
    @fuse_op
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if name in (b".", b".."):
            raise _fail(errno.ENOENT)   # not asked for: supports_dot_lookup is off
        path = paths.join(parent.path, _name(name, missing=errno.ENOENT))
        known = self.table.by_path.get(path)
        if known is not None and known.upload is not None:
            if known.upload.error is not None:
                raise _fail(errno.ENOENT)   # a lost version never shows
            known.lookups += 1              # being written here: not on the server yet
            return self.attrs(known)
        info = await self.client.stat(path, cached=False)
        return self.attrs(self.table.remember(path, info))

    @fuse_op
    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.table.forget(ino, count)

    @fuse_op
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        stale = time.monotonic() - node.fetched > self.options.attr_timeout
        # A committed file never changes; only a directory's mtime moves.
        if node.is_dir and stale and node.upload is None:
            info = await self.client.stat(node.path, cached=False)
            if identity(info) == node.identity:
                node.refresh(info)
        return self.attrs(node)

    @fuse_op
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if fields.update_size:
            self._writable()
            await self._truncate(node, attr.st_size)
        if fields.update_mtime and node.upload is not None:
            node.upload.mtime = attr.st_mtime_ns / 1e9   # becomes the committed mtime
            node.info = dataclasses.replace(node.info, mtime=node.upload.mtime)
        # Mode, owner and the times of committed entries are fixed (0644/0755, the
        # mounting user, the commit time): such changes succeed without effect.
        return self.attrs(node)

    async def _truncate(self, node: Node, size: int) -> None:
        upload = node.upload
        current = upload.pos if upload is not None else node.info.size
        if node.is_dir:
            raise _fail(errno.EISDIR)
        if size == current:
            return
        if upload is None and size == 0:     # truncate(1) to zero: a new, empty version
            node.refresh(await self.client.pipe(node.path, b""))
            return
        raise unsupported(f"{node.path}: truncate to {size} bytes is not supported "
                          f"(files are written once, front to back)")

    # -- directories -----------------------------------------------------------------
    @fuse_op
    async def opendir(self, inode: int, ctx: Any) -> int:
        node = self._node(inode)
        if not node.is_dir:
            raise NotADirectory(f"{node.path} is not a directory")
        return self._add(DirHandle(self.client, node, self.options.list_page_size))

    @fuse_op
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        handle = self.handles[fh]
        assert isinstance(handle, DirHandle)
        index = start_id
        while (entry := await handle.entry(index)) is not None:
            node = self.table.bind(entry.path, entry)
            if not pyfuse3.readdir_reply(token, entry.name.encode(), self.attrs(node),
                                         index + 1):
                return
            node.lookups += 1     # readdirplus: the kernel now holds a reference
            index += 1

    @fuse_op
    async def releasedir(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        assert isinstance(handle, DirHandle)
        await handle.close()

    @fuse_op
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: Any) -> pyfuse3.EntryAttributes:
        self._writable()
        path = paths.join(self._node(parent_inode).path, _name(name))
        info = await self.client.mkdir(path, parents=False, exist_ok=False)
        return self.attrs(self.table.remember(path, info))

    @fuse_op
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._writable()
        path = paths.join(self._node(parent_inode).path, _name(name, missing=errno.ENOENT))
        if not (await self.client.stat(path, cached=False)).is_dir:
            raise _fail(errno.ENOTDIR)
        await self.client.rm(path, recursive=False)
        self.table.detach(path)

    @fuse_op
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._writable()
        path = paths.join(self._node(parent_inode).path, _name(name, missing=errno.ENOENT))
        node = self.table.by_path.get(path)
        writing = node is not None and node.upload is not None
        if writing:
            await node.upload.discard()  # type: ignore[union-attr]
        try:
            if (await self.client.stat(path, cached=False)).is_dir:
                raise _fail(errno.EISDIR)
            await self.client.rm(path)
        except NotFound:
            if not writing:
                raise
        self.table.detach(path)

    @fuse_op
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        self._writable()
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise _fail(errno.EINVAL)
        src = paths.join(self._node(parent_inode_old).path, _name(name_old, missing=errno.ENOENT))
        dst = paths.join(self._node(parent_inode_new).path, _name(name_new))
        moving = self.table.by_path.get(src)
        if moving is not None and moving.upload is not None:
            await moving.upload.commit()     # what was written so far moves with the name
        await self.client.rename(src, dst, overwrite=not flags & pyfuse3.RENAME_NOREPLACE)
        self.table.moved(src, dst)

    # -- files ---------------------------------------------------------------------
    @fuse_op
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if node.is_dir:
            raise _fail(errno.EISDIR)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        if writing:
            self._writable()
        await self._settled(node)
        info = await self._revalidate(node)
        if writing and (flags & os.O_TRUNC or info.size == 0):
            return await self._begin_write(node, exclusive=False)
        if writing and ((flags & os.O_ACCMODE) == os.O_WRONLY or flags & os.O_APPEND):
            raise unsupported(f"{node.path}: a committed file cannot be changed; open it with "
                              f"O_TRUNC to write a new version")
        if node.data is None:
            node.data = ChunkCache(self.client.reader(info),
                                   readahead=self.options.readahead_chunks,
                                   refresh=functools.partial(self._reader, node),
                                   pool=self.buffers, stats=self.cache_stats)
        node.opens += 1
        fh = self._add(ReadHandle(node, node.data, writable=writing))
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def _settled(self, node: Node) -> None:
        """Wait for a finished write's handle to go (the kernel releases it just after
        ``close`` returns); a write still in progress is EBUSY: one writer at a time,
        and no reader of a version that is not whole yet."""
        upload = node.upload
        if upload is None:
            return
        if upload.dirty and upload.error is None:
            raise _fail(errno.EBUSY)
        try:
            await asyncio.wait_for(upload.released.wait(), RELEASE_WAIT)
        except TimeoutError:
            raise _fail(errno.EBUSY) from None

    async def _revalidate(self, node: Node) -> FileInfo:
        """Close-to-open: the file at this path now, or ESTALE when another file took it
        (the kernel then looks the name up again and opens the new inode)."""
        try:
            info = await self.client.stat(node.path, cached=False)
        except NotFound:
            raise _fail(errno.ESTALE) from None
        if identity(info) != node.identity:
            raise _fail(errno.ESTALE)
        node.refresh(info)
        return info

    async def _reader(self, node: Node) -> Any:
        """A fresh reader for ``node`` after a failure: data servers may have moved."""
        info = await self.client.stat(node.path, cached=False)
        if identity(info) != node.identity:
            raise _fail(errno.ESTALE)
        node.refresh(info)
        return self.client.reader(info)

    async def _begin_write(self, node: Node, *, exclusive: bool) -> pyfuse3.FileInfo:
        upload = WriteHandle(self.client, node)
        await upload.begin(exclusive=exclusive)
        node.upload = upload
        node.opens += 1
        return pyfuse3.FileInfo(fh=self._add(upload), keep_cache=True)

    @fuse_op
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._writable()
        path = paths.join(self._node(parent_inode).path, _name(name))
        known = self.table.by_path.get(path)
        if known is not None:
            await self._settled(known)
        node = self.table.fresh(path, FileInfo(path=path, type="file", mtime=time.time()))
        try:
            fi = await self._begin_write(node, exclusive=bool(flags & os.O_EXCL))
        except BaseException:
            self.table.detach(path)
            raise
        node.lookups += 1
        return fi, self.attrs(node)

    @fuse_op
    async def read(self, fh: int, off: int, size: int) -> bytes | bytearray | memoryview:
        handle = self.handles[fh]
        if not isinstance(handle, ReadHandle):
            raise unsupported("reading a file while it is being written is not supported")
        data = await handle.cache.read(off, size)
        self.stats["read_requests"] += 1
        self.stats["read_bytes"] += len(data)
        self.stats["max_read"] = max(self.stats["max_read"], size)
        return data

    @fuse_op
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles[fh]
        if not isinstance(handle, WriteHandle):
            raise unsupported(f"{handle.node.path}: a committed file cannot be changed")
        n = await handle.write(off, buf)
        self.stats["write_requests"] += 1
        self.stats["write_bytes"] += n
        self.stats["max_write"] = max(self.stats["max_write"], n)
        return n

    @fuse_op
    async def flush(self, fh: int) -> None:
        handle = self.handles[fh]
        if isinstance(handle, WriteHandle):
            await self._commit(handle)

    @fuse_op
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.flush(fh)

    async def _commit(self, handle: WriteHandle) -> None:
        info = await handle.commit()
        if info is not None and not handle.unlinked:
            handle.node.refresh(info)

    @fuse_op
    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        node = handle.node
        node.opens -= 1
        if isinstance(handle, WriteHandle):
            try:
                await self._commit(handle)    # flush normally did this already
            except (StagerError, OSError) as exc:
                log.warning("%s: not committed: %s", node.path, exc)
            finally:
                node.upload = None
                handle.released.set()
        elif node.opens == 0 and node.data is not None:
            node.data.close()
            node.data = None
        self.table.forget(node.ino, 0)

    # -- the file system ---------------------------------------------------------------
    @fuse_op
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > 2.0:
            status = await self.client.status()
            s = pyfuse3.StatvfsData()
            s.f_bsize = s.f_frsize = 4096
            s.f_blocks = status["capacity"] // 4096
            s.f_bfree = s.f_bavail = max(0, status["capacity"] - status["used"]) // 4096
            s.f_files = status["files"] + status.get("directories", 0)
            s.f_ffree = s.f_favail = 1 << 32
            s.f_namemax = paths.MAX_NAME
            self._statfs = (now, s)
        return self._statfs[1]

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        # Not counted as an error: the kernel asks for security.capability per write.
        if inode == pyfuse3.ROOT_INODE and name == STATS_XATTR:
            return json.dumps(self.snapshot()).encode()
        raise _fail(pyfuse3.ENOATTR)

    @fuse_op
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [STATS_XATTR] if inode == pyfuse3.ROOT_INODE else []

    def snapshot(self) -> dict[str, Any]:
        """Counters of this mount (``getfattr -n user.stager.stats MOUNTPOINT``)."""
        out = dict(self.stats)
        out["errors"] = dict(self.stats["errors"])
        out.update(self.cache_stats)
        out["buffers_allocated"] = self.buffers.allocated
        out["inodes"] = len(self.table)
        out["open_handles"] = len(self.handles)
        out["targets"] = {t: c.to_json() for t, c in self.client.target_counters().items()}
        return out

    async def shutdown(self) -> None:
        """Unmounting: versions still being written are abandoned, never half-committed."""
        for handle in list(self.handles.values()):
            if isinstance(handle, WriteHandle):
                await handle.discard()
            elif isinstance(handle, DirHandle):
                await handle.close()
        self.handles.clear()
        self.buffers.clear()
