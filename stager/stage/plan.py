"""What a staging run copies and what it skips: pure functions, no I/O.

* **Selection**: ``--include``/``--exclude`` globs.  A pattern without ``/``
  matches a file's name at any depth (``*.parquet``); a pattern with ``/``
  matches the path relative to the source root (``train/**/*.tar``).  With
  includes, a file must match one; it must match no exclude.
* **Resume**: a file is skipped when the destination already holds it
  unchanged: same size, and the same ETag as recorded by the previous run's
  manifest (when the source has ETags), else the same mtime (staged files
  carry their source's mtime).  A source with neither is always copied.  A
  layout asked for explicitly must also match.
"""

from __future__ import annotations

import re
from functools import lru_cache

from fsspec.utils import glob_translate

from ..client.transfer import SourceFile
from ..protocol.manifest import Manifest
from ..protocol.models import FileInfo, LayoutSpec

MTIME_SLACK = 1e-3      # seconds: float round trips through JSON and stat never drift more


@lru_cache(maxsize=256)
def _pattern(glob: str) -> re.Pattern[str]:
    return re.compile(glob_translate(glob))


def selected(rel: str, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> bool:
    """Whether the file at relative path ``rel`` takes part in the run."""
    def matches(glob: str) -> bool:
        subject = rel if "/" in glob else rel.rsplit("/", 1)[-1]
        return bool(_pattern(glob.strip("/")).fullmatch(subject))

    if include and not any(matches(g) for g in include):
        return False
    return not any(matches(g) for g in exclude)


def layout_matches(spec: LayoutSpec | None, staged: FileInfo) -> bool:
    if spec is None:
        return True
    layout = staged.layout
    if layout is None:
        return False
    return ((spec.chunk_size is None or spec.chunk_size == layout.chunk_size)
            and (not spec.stripe_count or spec.stripe_count == layout.stripe_count)
            and (spec.replicas is None or spec.replicas == layout.replicas))


def unchanged(src: SourceFile, staged: FileInfo | None, recorded_etag: str | None,
              layout: LayoutSpec | None = None) -> bool:
    """Whether ``staged`` (the destination file, if any) already holds ``src``.

    ``recorded_etag`` is the ETag the previous run's manifest recorded for this
    file, and only when that manifest's file id is still the live one.
    """
    if staged is None or staged.is_dir or staged.size != src.size:
        return False
    if not layout_matches(layout, staged):
        return False
    if src.etag is not None and recorded_etag is not None:
        return src.etag == recorded_etag
    if src.mtime is not None:
        return abs(staged.mtime - src.mtime) <= MTIME_SLACK
    return False


def recorded_etags(previous: Manifest | None) -> dict[str, tuple[str, str]]:
    """``rel → (file_id, etag)`` from the previous run's manifest."""
    if previous is None:
        return {}
    etags = previous.extra.get("source_etags", {})
    if not isinstance(etags, dict):
        return {}
    return {f.path: (f.file_id, str(etags[f.path])) for f in previous.files
            if f.path in etags}


def etag_for(rel: str, staged: FileInfo | None,
             recorded: dict[str, tuple[str, str]]) -> str | None:
    hit = recorded.get(rel)
    if hit is None or staged is None or hit[0] != staged.file_id:
        return None
    return hit[1]
