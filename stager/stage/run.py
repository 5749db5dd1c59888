"""A staging run: list the source, skip what is already staged, copy the rest in
parallel, record the dataset manifest.

Stage-in (any fsspec URL → a stager directory) and stage-out (a stager path →
any fsspec URL) share the copy path of :mod:`stager.client.transfer`.  Small files
run many at a time; large files run a few at a time, each with its own window
of ranged reads.  The first failure cancels the run: files in flight are
aborted (nothing half-written becomes visible), files already committed stay
and are skipped by the next run, and no manifest is recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client.transfer import PART, WINDOW
from ..errors import BadRequest, NotADirectory, NotFound
from ..protocol import paths
from ..protocol.manifest import Manifest, ManifestFile
from ..protocol.models import FileInfo, LayoutSpec
from ..sources.open import open_source
from ..sources.source import Source
from . import plan
from .feed import Feed, Listed
from .progress import make_progress

if TYPE_CHECKING:
    from ..client import AsyncClient


@dataclass(frozen=True)
class StageOptions:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    layout: LayoutSpec | None = None
    small_files_in_flight: int = 64      # source requests of small files (and probes)
    large_files_in_flight: int = 4       # larger files, each with ``window`` reads in flight
    part_size: int = PART                # per ranged read (rounded to whole chunks)
    window: int = WINDOW                 # ranged reads of one large file in flight
    resume: bool = True                  # skip files already staged unchanged
    manifest: bool = True                # record a dataset manifest (directories only)
    progress: bool | None = False        # None: a bar when stderr is a terminal
    storage_options: dict[str, Any] = field(default_factory=dict)
    share: tuple[int, int] = (0, 1)      # (i, n): only every n-th listed file, from the i-th
                                         # (n stagers splitting one source; `stager job up`)

    def __post_init__(self) -> None:
        # Accept any iterable of globs (a list from the CLI), keep a hashable tuple.
        object.__setattr__(self, "include", tuple(self.include))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        if not 0 <= self.share[0] < self.share[1]:
            raise BadRequest(f"share {self.share}: (i, n) with 0 <= i < n")


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
        listing = await source.listing()
        single = list(listing) == [source.root]
        dst_root = await _file_destination(client, dst, source.name_of_root()) if single \
            else dst
        entries = _entries(source, listing, options, single)
        staged = await _staged_files(client, dst_root, single)
        recorded = plan.recorded_etags(await _manifest_of(client, dst_root, single, options))
        # an http listing has no sizes: the bytes total grows as files are described
        progress.start(len(entries), sum(e.info.get("size") or 0 for e in entries))
        if not single:
            await client.mkdir(dst_root, exist_ok=True)

        def destination(f: plan.SourceFile) -> str:
            return dst_root if single else paths.join(dst_root, f.rel)

        out = await Feed(client, source, options, progress, staged, recorded,
                         destination).run(entries)
        files = sorted(out.files, key=lambda f: f.path)
        report.files, report.skipped, report.copied = len(files), len(out.skipped), len(
            out.copied)
        report.bytes_skipped = sum(f.size for f in files if f.rel in out.skipped)
        report.bytes_copied = sum(i.size for i in out.copied.values())
        if options.manifest and not single:
            report.manifest_files = await client.put_manifest(
                _manifest(src_url, dst_root, files, {**out.skipped, **out.copied}))
    finally:
        progress.stop()
        await source.close()
    report.seconds = time.perf_counter() - started
    return report


async def _file_destination(client: AsyncClient, dst: str, name: str) -> str:
    """``stage file.bin /dir/`` and ``stage file.bin /existing-dir`` mean ``/dir/file.bin``."""
    if dst.endswith("/"):
        return paths.join(dst, name)
    try:
        if (await client.stat(dst, cached=False)).is_dir:
            return paths.join(dst, name)
    except NotFound:
        pass
    return paths.normalize(dst)


def _entries(source: Source, listing: dict[str, dict[str, Any]], options: StageOptions,
             single: bool) -> list[Listed]:
    """The listed files that take part in the run, in path order."""
    entries = []
    for path, info in sorted(listing.items()):
        if info.get("type", "file") != "file":
            continue
        rel = "" if single else source.relative(path)
        if single or plan.selected(rel, options.include, options.exclude):
            entries.append(Listed(path, rel, info))
    index, count = options.share
    return entries[index::count]


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


def _manifest(src_url: str, dst_root: str, files: list[plan.SourceFile],
              done: dict[str, FileInfo]) -> Manifest:
    entries = tuple(ManifestFile(f.rel, done[f.rel].size, done[f.rel].mtime,
                                 done[f.rel].file_id or "") for f in files)
    etags = {f.rel: f.etag for f in files if f.etag is not None}
    extra: dict[str, Any] = {"source_etags": etags} if etags else {}
    return Manifest(path=paths.normalize(dst_root), files=entries, source=src_url,
                    created=time.time(), extra=extra)
