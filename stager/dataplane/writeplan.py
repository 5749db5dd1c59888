"""Write plans: which chunk of which upload goes to which targets.

Every chunk the client writes (streams: ``pipe``, ``put``, ``open("wb")``, the
mount, the gateway's PUT; ``write_many``'s small files) is a row of a plan, stored
by the one executor, :class:`~stager.dataplane.writeengine.WriteEngine`.  A row is
a chunk: its upload, index, length, CRC32C, bytes while held, and the targets that
proved they stored it.  The targets it wants come from its upload's layout (a table
of slots per distinct layout), so a reroute moves all of an upload's rows at once,
and finding every missing copy of thousands of small files, by target, is a few
array operations rather than an object per copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..checksum import crc32c
from ..errors import StagerError
from ..layout import chunk_targets
from ..protocol.models import Layout, chunk_id

# The arrays' first sizes: a small file's plan (one upload, one chunk, R targets) fits.
FIRST_ROWS, FIRST_TARGETS, FIRST_UPLOADS = 4, 4, 1


@dataclass
class Placement:
    """One upload: where its chunks go now, the targets routed around, and the
    error that keeps it from being stored (``None`` while it can be)."""

    file_id: str
    layout: Layout
    locations: dict[str, str]
    rerouted: list[str] = field(default_factory=list)
    error: StagerError | None = None


def cut(data: bytes | bytearray | memoryview, chunk_size: int) -> list[memoryview]:
    """``data`` as its chunks, without copying."""
    view = memoryview(data).cast("B")
    return [view[at:at + chunk_size] for at in range(0, len(view), chunk_size)]


class WritePlan:
    """Uploads and their chunk rows.  A ``busy`` row is held by one engine call,
    which stores it; the others are stored or their upload failed.

    The arrays have room for more rows, targets and uploads than are in use (``n``
    rows, ``len(uploads)`` uploads), grown by doubling from a first size that holds a
    small file's plan (a gateway PUT makes one per request: each growth is a dozen
    array allocations, most of such a plan's cost)."""

    def __init__(self) -> None:
        self.uploads: list[Placement] = []
        # per upload (by number): no error yet, and its layout's first row in ``slots``
        # and its stripe count
        self.ok = np.zeros(FIRST_UPLOADS, dtype=bool)
        self.base, self.stripe = np.zeros((2, FIRST_UPLOADS), dtype=np.int64)
        self.slots = np.full((0, 1), -1, dtype=np.int64)    # per layout and slot: targets
        self._blocks: dict[Layout, int] = {}                # where a layout's slots begin
        self.targets: list[str] = []                        # by number
        self._numbers: dict[str, int] = {}
        self.n = 0                                          # rows in use
        self.file, self.index, self.length, self.crc = np.zeros((4, FIRST_ROWS),
                                                                dtype=np.int64)
        self.busy = np.zeros(FIRST_ROWS, dtype=bool)        # held by an engine call
        self.placed = np.zeros((FIRST_ROWS, FIRST_TARGETS), dtype=bool)  # row x target:
        #                                                     proved stored
        self.data: list[memoryview | None] = []             # a row's bytes while held

    def add_uploads(self, uploads: Sequence[Placement]) -> None:
        first, self.uploads = len(self.uploads), self.uploads + list(uploads)
        if len(self.uploads) > len(self.ok):
            size = max(len(self.uploads), 2 * len(self.ok))
            self.ok, self.base, self.stripe = (_grown(a, (size,)) for a in
                                               (self.ok, self.base, self.stripe))
        for k, u in enumerate(uploads, first):
            self.ok[k] = u.error is None
            self.base[k], self.stripe[k] = self._block(u.layout), u.layout.stripe_count

    def add(self, files: Sequence[int], indices: Sequence[int],
            chunks: Sequence[memoryview]) -> np.ndarray:
        """Rows for chunk ``indices[k]`` of upload ``files[k]``, ``chunks[k]`` its
        bytes, held by the caller; returns their numbers."""
        n = len(chunks)
        rows = np.arange(self.n, self.n + n)
        self._fit(self.n + n)
        if n == 1:          # a stream's chunk: scalars cost less than lists made arrays
            r, c = self.n, chunks[0]
            self.file[r], self.index[r], self.length[r] = files[0], indices[0], c.nbytes
            self.crc[r] = crc32c(c)
            self.busy[r] = True
        else:
            self.file[rows], self.index[rows] = files, indices
            self.length[rows] = [c.nbytes for c in chunks]
            self.crc[rows] = [crc32c(c) for c in chunks]
            self.busy[rows] = True
        self.data += chunks
        self.n += n
        return rows

    def missing(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The copies of ``rows`` (of uploads still ok) that their upload's layout
        wants and no target proved stored: (row, target number), by target."""
        if len(rows) == 1:      # a stream's chunk: plain ints cost less than array calls
            r = int(rows[0])
            f = int(self.file[r])
            if not self.ok[f]:
                return rows[:0], rows[:0]
            want = self.slots[int(self.base[f]) + int(self.index[r]) % int(self.stripe[f])]
            ts = [t for t in want.tolist() if t >= 0 and not self.placed[r, t]]
            return np.full(len(ts), r, dtype=np.int64), np.array(sorted(ts), dtype=np.int64)
        rows = rows[self.ok[self.file[rows]]]
        f = self.file[rows]
        want = self.slots[self.base[f] + self.index[rows] % self.stripe[f]]
        r, c = np.nonzero((want >= 0) & ~self.placed[rows[:, None], np.maximum(want, 0)])
        order = np.argsort(want[r, c], kind="stable")
        return rows[r][order], want[r, c][order]

    def reroute(self, upload: int, target: str, layout: Layout,
                locations: Mapping[str, str]) -> np.ndarray:
        """Upload ``upload`` routed around ``target`` to ``layout``; returns its rows
        stored before that miss a copy now, held by the caller from now on."""
        up = self.uploads[upload]
        up.rerouted.append(target)
        up.layout = layout
        up.locations.update(locations)
        self.base[upload], self.stripe[upload] = self._block(layout), layout.stripe_count
        mine = np.flatnonzero((self.file[:self.n] == upload) & ~self.busy[:self.n])
        stale = np.unique(self.missing(mine)[0])
        self.busy[stale] = True
        return stale

    def fail(self, upload: int, error: StagerError) -> None:
        self.uploads[upload].error = self.uploads[upload].error or error
        self.ok[upload] = False

    def name(self, row: int) -> str:
        return chunk_id(self.uploads[int(self.file[row])].file_id, int(self.index[row]))

    def checksums(self) -> list[tuple[int, ...]]:
        """Each upload's chunk CRC32Cs in chunk order (one sort for all of them)."""
        file, n = self.file[:self.n], self.n
        if len(self.uploads) == 1 and n <= 1:      # a small file's: no sort
            return [tuple(self.crc[:n].tolist())]
        crcs = self.crc[:n][np.lexsort((self.index[:n], file))].tolist()
        ends = np.cumsum(np.bincount(file, minlength=len(self.uploads))).tolist()
        return [tuple(crcs[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def _block(self, layout: Layout) -> int:
        """The rows of ``slots`` for ``layout``: each stripe slot's targets, numbered."""
        at = self._blocks.get(layout)
        if at is not None:
            return at
        block = [[self._numbers.setdefault(t, len(self._numbers))
                  for t in chunk_targets(layout, i)] for i in range(layout.stripe_count)]
        self.targets = list(self._numbers)
        at, width = len(self.slots), max(self.slots.shape[1], *map(len, block))
        slots = np.full((at + len(block), width), -1, dtype=np.int64)
        if at:
            slots[:at, :self.slots.shape[1]] = self.slots
        for i, targets in enumerate(block, at):
            slots[i, :len(targets)] = targets
        self._blocks[layout], self.slots = at, slots
        self._fit(self.n)
        return at

    def _fit(self, rows: int) -> None:
        """Room for ``rows`` rows and every target numbered (doubling: a stream adds
        its rows one at a time)."""
        have_rows, have_targets = self.placed.shape
        if rows <= have_rows and len(self.targets) <= have_targets:
            return
        if rows > have_rows:
            grow = max(rows, 2 * have_rows)
            self.file, self.index, self.length, self.crc, self.busy = (
                _grown(a, (grow,)) for a in (self.file, self.index, self.length, self.crc,
                                              self.busy))
            have_rows = grow
        if len(self.targets) > have_targets:
            have_targets = max(len(self.targets), 2 * have_targets)
        self.placed = _grown(self.placed, (have_rows, have_targets))


def _grown(old: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``old`` in a zeroed array of ``shape`` (at least as large in every dimension)."""
    new = np.zeros(shape, dtype=old.dtype)
    new[tuple(map(slice, old.shape))] = old
    return new
