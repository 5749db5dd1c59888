"""A client's decode of a resolved manifest, before and after issue 19, side by side.

    python -m bench.profile_decode [N] [ROUNDS]     # N files (default 100,000)

Builds the server's resolved form of an N-file dataset (every 100th file stale,
the others with a layout index and C checksums each, for C = 0, 1 and 4), gzips
it as the server does, then times, on the same body in the same process, the
median of ROUNDS decodes (inflate included) by:

- before: ``json.loads`` and the per-file checks and dataclasses of
  ``Manifest.from_json`` as they were before issue 19 (copied below, unchanged
  but for names);
- after: :meth:`stager.protocol.manifest.Manifest.decode`.

Both must give the same files, or the run fails.
"""

from __future__ import annotations

import gzip
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stager.errors import BadRequest
from stager.protocol import paths
from stager.protocol.manifest import Manifest
from stager.protocol.models import Layout, check_file_id, count_of, field_of


def resolved_body(n: int, sums: int, seed: int = 1) -> bytes:
    """The gzip'd resolved manifest of ``n`` files, ``sums`` checksums a file."""
    rnd = random.Random(seed)
    layouts = [Layout(4 << 20, 2, 1, (f"t{k}", f"t{k + 1}"), ("n0", "n1")).to_json()
               for k in range(3)]
    files: list[dict[str, Any]] = []
    for i in range(n):
        f: dict[str, Any] = {"path": f"shard{i // 1000:03d}/sample{i:07d}.jpg",
                             "size": rnd.randrange(1 << 22), "mtime": 1.7e9 + i,
                             "file_id": f"{rnd.getrandbits(128):032x}"}
        if i % 100 == 7:
            f["stale"] = True
        else:
            f["layout"] = i % 3
            f["checksums"] = [f"{rnd.getrandbits(32):08x}" for _ in range(sums)]
        files.append(f)
    body = {"version": 1, "source": "s3://bucket/ds", "created": 1.7e9, "extra": {},
            "files": files, "path": "/ds", "layouts": layouts,
            "locations": {f"t{k}": f"http://node{k}:7000" for k in range(4)}}
    return gzip.compress(json.dumps(body).encode(), 6)


# -- before issue 19 ------------------------------------------------------------------

@dataclass(frozen=True)
class _FileBefore:
    path: str
    size: int
    mtime: float = 0.0
    file_id: str = ""
    layout: Layout | None = None
    checksums: tuple[int, ...] | None = None
    stale: bool = False

    @classmethod
    def from_json(cls, obj: Any) -> _FileBefore:
        rel = field_of(obj, "path", str)
        if paths.normalize(rel) != "/" + rel.strip("/") or rel.startswith("/"):
            raise BadRequest(f"manifest paths are relative and canonical: {rel!r}")
        return cls(path=rel, size=count_of(obj, "size"),
                   mtime=float(field_of(obj, "mtime", (int, float), 0.0)),
                   file_id=check_file_id(field_of(obj, "file_id", str)))


def decode_before(raw: bytes) -> list[_FileBefore]:
    obj = json.loads(gzip.decompress(raw))
    layouts = [Layout.from_json(x) for x in field_of(obj, "layouts", list, [])]
    files = []
    for r in field_of(obj, "files", list):
        f = _FileBefore.from_json(r)
        if "layout" in r:
            index = field_of(r, "layout", int)
            if not 0 <= index < len(layouts):
                raise BadRequest("manifest file refers to a missing layout")
            sums = field_of(r, "checksums", list, [])
            f = _FileBefore(f.path, f.size, f.mtime, f.file_id, layouts[index],
                            tuple(int(c, 16) for c in sums), stale=bool(r.get("stale", False)))
        elif r.get("stale"):
            f = _FileBefore(f.path, f.size, f.mtime, f.file_id, stale=True)
        files.append(f)
    return files


def decode_after(raw: bytes) -> Manifest:
    return Manifest.decode(gzip.decompress(raw))


def median_seconds(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    """The median wall and CPU seconds of ``rounds`` calls of ``fn`` (CPU: steadier
    than wall on a shared machine)."""
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


def main(n: int, rounds: int) -> None:
    for sums in (0, 1, 4):
        raw = resolved_body(n, sums)
        before, after = decode_before(raw), decode_after(raw)
        fields = ("path", "size", "mtime", "file_id", "layout", "checksums", "stale")
        if [[getattr(f, k) for k in fields] for f in before] != \
                [[getattr(f, k) for k in fields] for f in after.files]:
            raise SystemExit("before and after decoded different files")
        del before, after
        old = median_seconds(lambda: decode_before(raw), rounds)     # noqa: B023
        new = median_seconds(lambda: decode_after(raw), rounds)      # noqa: B023
        print(f"{n:,} files, {sums} checksums each, {len(raw):,} bytes gzip'd, "
              f"median of {rounds}: before {old[0]:.3f} s wall, {old[1]:.3f} s CPU; "
              f"after {new[0]:.3f} s wall, {new[1]:.3f} s CPU; "
              f"{old[0] / new[0]:.1f}x wall, {old[1] / new[1]:.1f}x CPU")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 5)
