"""A staging run: list the source, skip what is already staged, copy the rest in
parallel, record the dataset manifest.

Stage-in (any fsspec URL → a stager directory) and stage-out (a stager path →
any fsspec URL) share the copy path of :mod:`stager.stage.copy`.  Small files
run many at a time; large files run a few at a time, each with its own window
of ranged reads.  The first failure cancels the run: files in flight are
aborted (nothing half-written becomes visible), files already committed stay
and are skipped by the next run, and no manifest is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..aio import gather_or_cancel
from ..errors import NotADirectory, NotFound, SourceError, StagerError
from ..protocol import paths
from ..protocol.manifest import Manifest, ManifestFile
from ..protocol.models import FileInfo, LayoutSpec
from . import plan
from .copy import PART, WINDOW, buffers_for, copy_in
from .progress import Progress, make_progress
from .small import copy_small
from .source import Source, open_source, source_etag, source_mtime

if TYPE_CHECKING:
    from ..client import AsyncClient

T = TypeVar("T")


@dataclass(frozen=True)
class StageOptions:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    layout: LayoutSpec | None = None
    small_files_in_flight: int = 64      # files up to ``part_size``, each one request
    large_files_in_flight: int = 4       # larger files, each with ``window`` reads in flight
    part_size: int = PART                # per ranged read (rounded to whole chunks)
    window: int = WINDOW                 # ranged reads of one large file in flight
    resume: bool = True                  # skip files already staged unchanged
    manifest: bool = True                # record a dataset manifest (directories only)
    progress: bool | None = False        # None: a bar when stderr is a terminal
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Accept any iterable of globs (a list from the CLI), keep a hashable tuple.
        object.__setattr__(self, "include", tuple(self.include))
        object.__setattr__(self, "exclude", tuple(self.exclude))


@dataclass
class StageReport:
    source: str
    destination: str
    files: int = 0
    copied: int = 0
    skipped: int = 0
    bytes_copied: int = 0
    bytes_skipped: int = 0
    seconds: float = 0.0
    manifest_files: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        secs = self.seconds or 1e-9
        return (f"staged {self.copied} file(s), {self.bytes_copied} bytes, skipped "
                f"{self.skipped} unchanged, in {self.seconds:.2f}s "
                f"({self.bytes_copied / secs / (1 << 20):.1f} MiB/s, "
                f"{self.copied / secs:.0f} files/s)")


async def stage_in(client: AsyncClient, src_url: str, dst: str,
                   options: StageOptions) -> StageReport:
    """Copy the file or tree at ``src_url`` into the stager path ``dst``."""
    started = time.perf_counter()
    source = open_source(src_url, **options.storage_options)
    progress = make_progress(options.progress, src_url)
    report = StageReport(src_url, dst)
    try:
        listing = await source.files()
        single = list(listing) == [source.root]
        dst_root = await _file_destination(client, dst, source.root) if single else dst
        files = _source_files(source, listing, options, single)
        staged = await _staged_files(client, dst_root, single)
        recorded = plan.recorded_etags(await _manifest_of(client, dst_root, single, options))
        todo, done = _split(files, staged, recorded, options)
        progress.start(len(files), sum(f.size for f in files))
        report.files, report.skipped = len(files), len(done)
        report.bytes_skipped = sum(f.size for f in files if f.rel in done)
        for f in files:
            if f.rel in done:
                progress.file_done(f.size)
        if not single:
            await client.mkdir(dst_root, exist_ok=True)
        copied = await _copy_all(client, source, todo, dst_root, single, options, progress)
        done.update(copied)
        report.copied = len(copied)
        report.bytes_copied = sum(i.size for i in copied.values())
        if options.manifest and not single:
            report.manifest_files = await client.put_manifest(
                _manifest(src_url, dst_root, files, done))
    finally:
        progress.stop()
        await source.close()
    report.seconds = time.perf_counter() - started
    return report


async def _file_destination(client: AsyncClient, dst: str, src_path: str) -> str:
    """``stage file.bin /dir/`` and ``stage file.bin /existing-dir`` mean ``/dir/file.bin``."""
    name = src_path.rstrip("/").rsplit("/", 1)[-1]
    if dst.endswith("/"):
        return paths.join(dst, name)
    try:
        if (await client.stat(dst, cached=False)).is_dir:
            return paths.join(dst, name)
    except NotFound:
        pass
    return paths.normalize(dst)


def _source_files(source: Source, listing: dict[str, dict[str, Any]], options: StageOptions,
                  single: bool) -> list[plan.SourceFile]:
    files = []
    for path, info in sorted(listing.items()):
        rel = "" if single else source.relative(path)
        if not single and not plan.selected(rel, options.include, options.exclude):
            continue
        size = info.get("size")
        if size is None:
            raise SourceError(f"source {source.name(path)} does not report its size",
                              url=source.name(path))
        files.append(plan.SourceFile(path, rel, int(size), source_mtime(info),
                                     source_etag(info)))
    return files


async def _staged_files(client: AsyncClient, dst: str, single: bool) -> dict[str, FileInfo]:
    """``rel → FileInfo`` of what the destination already holds."""
    try:
        info = await client.stat(dst, cached=False)
    except NotFound:
        return {}
    if single:
        return {"": info}
    if not info.is_dir:
        raise NotADirectory(f"destination {dst} is a file, the source a directory", path=dst)
    prefix = info.path.rstrip("/") + "/"
    return {f.path[len(prefix):]: f async for f in client.walk(dst)}


async def _manifest_of(client: AsyncClient, dst: str, single: bool,
                       options: StageOptions) -> Manifest | None:
    if single or not options.resume:
        return None
    try:
        return await client.get_manifest(dst)
    except (NotFound, NotADirectory):
        return None


def _split(files: list[plan.SourceFile], staged: dict[str, FileInfo],
           recorded: dict[str, tuple[str, str]], options: StageOptions
           ) -> tuple[list[plan.SourceFile], dict[str, FileInfo]]:
    """(files to copy, ``rel → FileInfo`` of files already staged unchanged)."""
    todo, done = [], {}
    for f in files:
        have = staged.get(f.rel)
        etag = plan.etag_for(f.rel, have, recorded)
        if options.resume and have is not None and plan.unchanged(f, have, etag,
                                                                  options.layout):
            done[f.rel] = have
        else:
            todo.append(f)
    return todo, done


async def _copy_all(client: AsyncClient, source: Source, todo: list[plan.SourceFile],
                    dst_root: str, single: bool, options: StageOptions,
                    progress: Progress) -> dict[str, FileInfo]:
    copied: dict[str, FileInfo] = {}
    buffers = buffers_for(options.large_files_in_flight, options.window,
                          client.config.readahead_chunks)

    async def one(f: plan.SourceFile) -> None:
        dst = dst_root if single else paths.join(dst_root, f.rel)
        try:
            copied[f.rel] = await copy_in(client, source, f.path, f.size, dst,
                                          layout=options.layout, mtime=f.mtime,
                                          on_bytes=progress.advance,
                                          part=options.part_size, window=options.window,
                                          buffers=buffers)
        except StagerError as exc:
            raise _naming(exc, source.name(f.path), dst) from exc
        progress.file_done()

    def destination(f: plan.SourceFile) -> str:
        return dst_root if single else paths.join(dst_root, f.rel)

    async def small_files(files: list[plan.SourceFile]) -> None:
        # in batches: one create, one commit and a chunk request per target per batch
        copied.update(await copy_small(
            client, source, files, destination, layout=options.layout,
            files_in_flight=options.small_files_in_flight, on_bytes=progress.advance,
            on_file=progress.file_done,
            naming=lambda exc, f: _naming(exc, source.name(f.path), destination(f))))

    small = [f for f in todo if f.size <= options.part_size]
    large = sorted((f for f in todo if f.size > options.part_size), key=lambda f: -f.size)
    await gather_or_cancel([small_files(small),
                            run_pool(large, options.large_files_in_flight, one)])
    return copied


def _naming(exc: StagerError, src: str, dst: str) -> StagerError:
    """The same error, its message naming the file (source errors name it already)."""
    if "url" in exc.details or src in exc.message:
        return exc
    return type(exc)(f"staging {src} to {dst}: {exc.message}", **exc.details)


def _manifest(src_url: str, dst_root: str, files: list[plan.SourceFile],
              done: dict[str, FileInfo]) -> Manifest:
    entries = tuple(ManifestFile(f.rel, done[f.rel].size, done[f.rel].mtime,
                                 done[f.rel].file_id or "") for f in files)
    etags = {f.rel: f.etag for f in files if f.etag is not None}
    extra: dict[str, Any] = {"source_etags": etags} if etags else {}
    return Manifest(path=paths.normalize(dst_root), files=entries, source=src_url,
                    created=time.time(), extra=extra)


async def run_pool(items: Iterable[T], workers: int,
                   work: Callable[[T], Awaitable[None]]) -> None:
    """``work(item)`` for every item, ``workers`` at a time; the first error cancels."""
    queue = iter(items)

    async def worker() -> None:
        for item in queue:          # one shared iterator: each item goes to one worker
            await work(item)

    await gather_or_cancel(worker() for _ in range(max(1, workers)))
