"""Stage-out: copy a stager file or tree back to any fsspec URL.

Each destination file appears whole or not at all (see
:mod:`stager.client.transfer.sinks`).  A rerun skips files the destination already holds
with the same size and mtime (local destinations get the staged file's mtime).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from fsspec.core import url_to_fs

from ..aio import gather_or_cancel
from ..client.transfer import copy_out, run_pool, sink_for
from ..errors import NotFound, SourceError, StagerError
from ..protocol.models import FileInfo
from ..sources.open import filesystem_class
from ..sources.source import backend_error, source_mtime
from . import plan
from .progress import make_progress
from .run import StageOptions, StageReport

if TYPE_CHECKING:
    from ..client import AsyncClient

T = TypeVar("T")


async def stage_out(client: AsyncClient, src: str, dst_url: str,
                    options: StageOptions) -> StageReport:
    """Copy the stager file or directory ``src`` to ``dst_url``."""
    started = time.perf_counter()
    filesystem_class(dst_url)                      # unknown protocol: a clear error first
    fs, root = url_to_fs(dst_url, **options.storage_options)
    root = root.rstrip("/") or root
    try:
        info = await client.stat(src, cached=False)
    except NotFound:
        raise NotFound(f"stager source {src} does not exist", path=src) from None
    files = await _listing(client, info, options)
    if info.is_dir:
        targets = {rel: f"{root}/{rel}" for rel in files}
    else:
        into_dir = dst_url.endswith("/") or await _at(dst_url, asyncio.to_thread(fs.isdir, root))
        targets = {"": f"{root}/{info.name}" if into_dir else root}
    existing = await _at(dst_url, asyncio.to_thread(_existing, fs, root))
    todo = [rel for rel, f in files.items() if not _unchanged(f, existing.get(targets[rel]))]
    report = StageReport(f"stager://{info.path}", dst_url, files=len(files),
                         skipped=len(files) - len(todo))
    report.bytes_skipped = sum(f.size for rel, f in files.items() if rel not in todo)
    progress = make_progress(options.progress, info.path)
    progress.start(len(files), sum(f.size for f in files.values()))
    progress.bytes_done = report.bytes_skipped
    progress.files_done = report.skipped

    async def one(rel: str) -> None:
        f = files[rel]
        try:
            await _at(dst_url, copy_out(client, f, sink_for(fs, targets[rel]),
                                          on_bytes=progress.advance))
        except StagerError as exc:
            raise type(exc)(f"staging {f.path} to {targets[rel]}: {exc.message}",
                            **exc.details) from exc
        progress.file_done()

    try:
        small = [r for r in todo if files[r].size <= options.part_size]
        large = [r for r in todo if files[r].size > options.part_size]
        await gather_or_cancel([run_pool(small, options.small_files_in_flight, one),
                                run_pool(large, options.large_files_in_flight, one)])
    finally:
        progress.stop()
    report.copied = len(todo)
    report.bytes_copied = sum(files[r].size for r in todo)
    report.seconds = time.perf_counter() - started
    return report


async def _at(dst_url: str, work: Awaitable[T]) -> T:
    """Await ``work`` on the destination; its backend library's own errors (botocore's:
    no endpoint, no credentials) become :class:`SourceError` naming ``dst_url``."""
    try:
        return await work
    except StagerError:
        raise
    except Exception as exc:
        if not backend_error(exc):
            raise
        raise SourceError(f"cannot write destination {dst_url}: {type(exc).__name__}: {exc}",
                          url=dst_url) from exc


async def _listing(client: AsyncClient, info: FileInfo,
                   options: StageOptions) -> dict[str, FileInfo]:
    if not info.is_dir:
        return {"": info}
    prefix = info.path.rstrip("/") + "/"
    out = {}
    async for f in client.walk(info.path):
        rel = f.path[len(prefix):]
        if plan.selected(rel, options.include, options.exclude):
            out[rel] = f
    return out


def _existing(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    try:
        found = fs.find(root, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {path.rstrip("/"): info for path, info in found.items()}


def _unchanged(staged: FileInfo, dest: dict[str, Any] | None) -> bool:
    if dest is None or dest.get("size") != staged.size:
        return False
    mtime = source_mtime(dest)
    return mtime is not None and abs(mtime - staged.mtime) <= plan.MTIME_SLACK
