"""What a loader reads: a source path resolved to its files, each with layout and checksums.

A staged dataset has a manifest: one request returns every file with its layout
and chunk checksums (see :mod:`stager.protocol.manifest`).  Without one, the
directory is walked with listings, which carry the same.  Either way no file
needs a stat of its own, except a manifest entry whose file changed since
staging (``stale``), which is looked up again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..client import AsyncClient
from ..errors import NotFound
from ..protocol import paths
from ..protocol.metaurls import from_hosts
from ..protocol.models import FileInfo


@dataclass(frozen=True)
class DatasetFile:
    rel: str             # path relative to the source ("/"-separated); the name for a file
    info: FileInfo


@dataclass(frozen=True)
class Dataset:
    path: str
    is_dir: bool
    files: tuple[DatasetFile, ...]
    from_manifest: bool = False

    def names(self) -> list[str]:
        return [f.rel for f in self.files]


def parse_source(source: str) -> tuple[str, str | None]:
    """``(path, meta_url or None)`` of ``/a/b``, ``stager:///a/b`` or ``stager://host:port/a/b``."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"a loader source is a stager path or URL, not {source!r}")
    if "://" not in source:
        return paths.normalize(source), None
    url = urlsplit(source)
    if url.scheme != "stager":
        raise ValueError(f"only stager:// URLs can be loaded, not {url.scheme}://")
    meta = from_hosts(url.netloc) if url.netloc else None     # stager://a:7070,b:7070/p
    return paths.normalize(url.path or "/"), meta


async def resolve(client: AsyncClient, path: str) -> Dataset:
    """The files of ``path``: the manifest's when recorded, else a walk of listings."""
    info = await client.stat(path, cached=False)
    if not info.is_dir:
        return Dataset(info.path, False, (DatasetFile(info.name, info),))
    manifest = await client.get_manifest(info.path)
    if manifest is not None:
        files = []
        for f in manifest.files:
            if f.stale or f.layout is None:
                full = paths.join(info.path, f.path)
                try:
                    live = await client.stat(full, cached=False)
                except NotFound:
                    raise NotFound(f"{full} is in the dataset manifest of {info.path} but no "
                                   "longer exists", path=full) from None
            else:
                live = manifest.file_info(f)
            files.append(DatasetFile(f.path, live))
        return Dataset(info.path, True, tuple(files), from_manifest=True)
    found = [DatasetFile(e.path[len(info.path):].lstrip("/"), e)
             async for e in _walk_listings(client, info.path)]
    found.sort(key=lambda f: f.rel)
    return Dataset(info.path, True, tuple(found))


async def _walk_listings(client: AsyncClient, path: str) -> AsyncIterator[FileInfo]:
    async for entry in client.iter_dir(path):
        if entry.is_dir:
            async for sub in _walk_listings(client, entry.path):
                yield sub
        else:
            yield entry
