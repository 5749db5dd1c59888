"""Dataset manifests: the files of a staged dataset, recorded once, read in one request.

Staging records a manifest on the dataset's directory (relative path, size,
mtime, file id of every file).  Reading it back, the metadata server *resolves*
it against the live namespace: each file gains its layout (deduplicated into
``layouts``), its chunk checksums, and ``stale: true`` when the file at that
path is no longer the one that was staged.  A loader can therefore start on a
100,000-file dataset with one request instead of a listing and 100,000 stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from . import paths
from .models import FileInfo, Layout, check_file_id, count_of, field_of

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ManifestFile:
    path: str                  # relative to the dataset directory, "/"-separated
    size: int
    mtime: float = 0.0
    file_id: str = ""
    layout: Layout | None = None          # filled in when resolved
    checksums: tuple[int, ...] | None = None
    stale: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mtime": self.mtime,
                "file_id": self.file_id}

    @classmethod
    def from_json(cls, obj: Any) -> ManifestFile:
        rel = field_of(obj, "path", str)
        if paths.normalize(rel) != "/" + rel.strip("/") or rel.startswith("/"):
            raise BadRequest(f"manifest paths are relative and canonical: {rel!r}")
        return cls(path=rel, size=count_of(obj, "size"),
                   mtime=float(field_of(obj, "mtime", (int, float), 0.0)),
                   file_id=check_file_id(field_of(obj, "file_id", str)))


@dataclass(frozen=True)
class Manifest:
    path: str                                   # the dataset directory
    files: tuple[ManifestFile, ...]
    source: str = ""
    created: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    locations: dict[str, str] = field(default_factory=dict)   # target id → URL (resolved)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file_info(self, f: ManifestFile) -> FileInfo:
        """A FileInfo good enough to read ``f`` without a stat (when not stale)."""
        return FileInfo(path=paths.join(self.path, f.path), type="file", size=f.size,
                        mtime=f.mtime, file_id=f.file_id, layout=f.layout,
                        checksums=f.checksums, locations=self.locations)

    def to_json(self) -> dict[str, Any]:
        """The stored form (what a stager of data sends)."""
        return {"version": MANIFEST_VERSION, "source": self.source, "created": self.created,
                "extra": self.extra, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, obj: Any, path: str = "") -> Manifest:
        """Parse the stored form, or the resolved form the server returns."""
        version = field_of(obj, "version", int, MANIFEST_VERSION)
        if version != MANIFEST_VERSION:
            raise BadRequest(f"unsupported manifest version {version}")
        layouts = [Layout.from_json(x) for x in field_of(obj, "layouts", list, [])]
        files = []
        for raw in field_of(obj, "files", list):
            f = ManifestFile.from_json(raw)
            if "layout" in raw:
                index = field_of(raw, "layout", int)
                if not 0 <= index < len(layouts):
                    raise BadRequest("manifest file refers to a missing layout")
                sums = field_of(raw, "checksums", list, [])
                f = ManifestFile(f.path, f.size, f.mtime, f.file_id, layouts[index],
                                 tuple(int(c, 16) for c in sums),
                                 stale=bool(raw.get("stale", False)))
            elif raw.get("stale"):
                f = ManifestFile(f.path, f.size, f.mtime, f.file_id, stale=True)
            files.append(f)
        return cls(path=field_of(obj, "path", str, path), files=tuple(files),
                   source=field_of(obj, "source", str, ""),
                   created=float(field_of(obj, "created", (int, float), 0.0)),
                   extra=dict(field_of(obj, "extra", dict, {})),
                   locations=dict(field_of(obj, "locations", dict, {})))
