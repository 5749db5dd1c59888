"""The SQL of the managed cache in the SQLite store: attached directories, their files,
and which of their chunks are filled (the :class:`~..base.Caching` role).

A chunk row with a ``crc`` is filled; one without is a fill under way, leased to one
``holder`` until ``until``.  A lease is taken by one upsert whose ``WHERE`` lets it
through only when the row is new, the lease is the holder's own, or it expired: on
PostgreSQL the same statement is what makes two servers' takes exclusive
(:mod:`.postgres.cache`).  Nothing here cascades: dropping a file's rows is always
asked for, so a chunk's bytes are never forgotten while still on a data server.
Blocking; runs on the store's one thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from ....errors import NotFound
from ....protocol import paths
from ..caching import AttachmentRecord, CachedChunk, CachedFile
from .db import Database
from .quotas import QuotaSQL

_ATTACHMENT = ("path, source, options, refresh, include, exclude, listed, created, "
               "hits, misses")
_FILE = "file_id, attachment, path, key, version"
_CHUNK = "c.file_id, c.idx, c.size, c.crc, c.filled, c.used, f.path, f.attachment"
# The chunk rows of the files of one attachment.
_OF_ATTACHMENT = "file_id IN (SELECT file_id FROM cached_files WHERE attachment = ?)"
# The ids of a JSON list parameter, for ``IN``: one statement for a batch of any size.
_IDS = "(SELECT value FROM json_each(?))"


def attachment_of(row: Sequence[Any]) -> AttachmentRecord:
    path, source, options, refresh, include, exclude, listed, created, hits, misses = row
    return AttachmentRecord(path, source, bytes(options), refresh, tuple(json.loads(include)),
                            tuple(json.loads(exclude)), listed, created, hits, misses)


def file_of(row: Sequence[Any]) -> CachedFile:
    return CachedFile(*row)


def chunk_of(row: Sequence[Any]) -> CachedChunk:
    return CachedChunk(*row)


def usage_of(attachments: Iterable[str], files: Iterable[Sequence[Any]],
             chunks: Iterable[Sequence[Any]]) -> dict[str, tuple[int, int, int, int]]:
    """Per attachment: (files, their bytes, chunks filled, bytes filled), from the rows
    ``(attachment, files, bytes)`` and ``(attachment, chunks, bytes)`` of the two
    grouped queries (an attachment with neither is all zeros).  Both stores end here."""
    by_files = {r[0]: (int(r[1]), int(r[2])) for r in files}
    by_chunks = {r[0]: (int(r[1]), int(r[2])) for r in chunks}
    return {a: by_files.get(a, (0, 0)) + by_chunks.get(a, (0, 0)) for a in attachments}


class CacheSQL:
    """Attachments by path, cached files by file id, chunk rows by (file id, index)."""

    def __init__(self, database: Database) -> None:
        self.db = database.db
        self.tx: Callable[[], AbstractContextManager[object]] = database.transaction
        # filled bytes count against the quotas above their files: charged in the
        # transaction that records a fill, refunded in the one that drops its row
        self.quotas = QuotaSQL(database)

    # -- attachments -----------------------------------------------------------------
    def put_attachment(self, r: AttachmentRecord) -> None:
        r = replace(r, path=paths.normalize(r.path))
        with self.tx():
            self.db.execute(
                f"INSERT INTO attachments ({_ATTACHMENT}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (path) DO UPDATE SET source = excluded.source, "
                "options = excluded.options, refresh = excluded.refresh, "
                "include = excluded.include, exclude = excluded.exclude, "
                "listed = excluded.listed, created = excluded.created",
                (r.path, r.source, r.options, r.refresh, json.dumps(r.include),
                 json.dumps(r.exclude), r.listed, r.created, r.hits, r.misses))

    def attachments(self) -> list[AttachmentRecord]:
        rows = self.db.execute(f"SELECT {_ATTACHMENT} FROM attachments ORDER BY path")
        return [attachment_of(r) for r in rows]

    def drop_attachment(self, path: str) -> list[CachedFile]:
        path = paths.normalize(path)
        with self.tx():
            if self.db.execute("DELETE FROM attachments WHERE path = ?",
                               (path,)).rowcount != 1:
                raise NotFound(f"{path} is not an attached directory", path=path)
            files = self.cached_files(path)
            self.quotas.refund_chunks(f"c.{_OF_ATTACHMENT}", (path,))
            self.db.execute(f"DELETE FROM cache_chunks WHERE {_OF_ATTACHMENT}", (path,))
            self.db.execute("DELETE FROM cached_files WHERE attachment = ?", (path,))
        return files

    # -- cached files ----------------------------------------------------------------
    def put_cached_files(self, files: Sequence[CachedFile]) -> None:
        with self.tx():
            self.db.executemany(
                f"INSERT INTO cached_files ({_FILE}) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (file_id) DO UPDATE SET attachment = excluded.attachment, "
                "path = excluded.path, key = excluded.key, version = excluded.version",
                [(f.file_id, paths.normalize(f.attachment), f.path, f.key, f.version)
                 for f in files])

    def cached_files(self, attachment: str) -> list[CachedFile]:
        rows = self.db.execute(f"SELECT {_FILE} FROM cached_files WHERE attachment = ? "
                               "ORDER BY path", (paths.normalize(attachment),))
        return [file_of(r) for r in rows]

    def find_cached(self, file_ids: Sequence[str]) -> dict[str, CachedFile]:
        rows = self.db.execute(f"SELECT {_FILE} FROM cached_files WHERE file_id IN {_IDS}",
                               (json.dumps(list(file_ids)),))
        return {r[0]: file_of(r) for r in rows}

    def drop_cached_files(self, file_ids: Sequence[str]) -> None:
        ids = json.dumps(list(file_ids))
        with self.tx():
            self.quotas.refund_chunks(f"c.file_id IN {_IDS}", (ids,))
            self.db.execute(f"DELETE FROM cache_chunks WHERE file_id IN {_IDS}", (ids,))
            self.db.execute(f"DELETE FROM cached_files WHERE file_id IN {_IDS}", (ids,))

    # -- chunks ------------------------------------------------------------------------
    def filled_chunks(self, file_id: str, indexes: Sequence[int]) -> dict[int, int]:
        rows = self.db.execute(
            f"SELECT idx, crc FROM cache_chunks WHERE file_id = ? AND idx IN {_IDS} "
            "AND crc IS NOT NULL", (file_id, json.dumps(list(indexes))))
        return {int(i): int(crc) for i, crc in rows}

    def take_fill(self, file_id: str, index: int, holder: str, until: float,
                  now: float) -> bool:
        with self.tx():
            cur = self.db.execute(
                "INSERT INTO cache_chunks (file_id, idx, holder, until) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (file_id, idx) DO UPDATE SET holder = excluded.holder, "
                "until = excluded.until WHERE cache_chunks.crc IS NULL AND "
                "(cache_chunks.holder = excluded.holder OR cache_chunks.until <= ?)",
                (file_id, index, holder, until, now))
        return cur.rowcount == 1

    def record_fill(self, file_id: str, index: int, size: int, crc: int, now: float) -> bool:
        with self.tx():
            cached = self.db.execute("SELECT path FROM cached_files WHERE file_id = ?",
                                     (file_id,)).fetchone()
            if cached is None:
                # the file was refreshed or detached: its lease goes too, so no row is left
                self.db.execute("DELETE FROM cache_chunks WHERE file_id = ? AND idx = ? "
                                "AND crc IS NULL", (file_id, index))
                return False
            self._charge_fill(file_id, index, size, cached[0])
            self.db.execute(
                "INSERT INTO cache_chunks (file_id, idx, size, crc, filled, used) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (file_id, idx) DO UPDATE SET "
                "size = excluded.size, crc = excluded.crc, filled = excluded.filled, "
                "used = excluded.used, holder = NULL, until = NULL",
                (file_id, index, size, crc, now, now))
        return True

    def _charge_fill(self, file_id: str, index: int, size: int, path: str) -> None:
        """A fill's bytes join the use of the quotas above its file (less a filled
        row's it replaces); QuotaExceeded, before any change, where that passes one."""
        if not self.quotas.active():
            return
        entry = self.db.execute("SELECT parent FROM entries WHERE file_id = ? AND kind = "
                                "'file' AND json_extract(layout, '$.cached')",
                                (file_id,)).fetchone()
        if entry is None:
            return      # removed meanwhile (counts nowhere), or written (counts its size)
        old = self.db.execute("SELECT size FROM cache_chunks WHERE file_id = ? AND idx = ? "
                              "AND crc IS NOT NULL", (file_id, index)).fetchone()
        self.quotas.charge(int(entry[0]), size - (int(old[0]) if old else 0), 0, path=path)

    def release_fill(self, file_id: str, index: int, holder: str) -> None:
        with self.tx():
            self.db.execute("DELETE FROM cache_chunks WHERE file_id = ? AND idx = ? "
                            "AND holder = ? AND crc IS NULL", (file_id, index, holder))

    def touch_chunks(self, chunks: Sequence[tuple[str, int]], now: float,
                     counts: dict[str, tuple[int, int]] | None) -> None:
        with self.tx():
            self.db.executemany(
                "UPDATE cache_chunks SET used = max(used, ?) WHERE file_id = ? AND idx = ? "
                "AND crc IS NOT NULL", [(now, f, i) for f, i in chunks])
            self.db.executemany(
                "UPDATE attachments SET hits = hits + ?, misses = misses + ? WHERE path = ?",
                [(h, m, paths.normalize(a)) for a, (h, m) in (counts or {}).items()])

    def cache_chunks(self, after: tuple[str, int], limit: int) -> list[CachedChunk]:
        rows = self.db.execute(
            f"SELECT {_CHUNK} FROM cache_chunks c JOIN cached_files f ON f.file_id = c.file_id "
            "WHERE c.crc IS NOT NULL AND (c.file_id, c.idx) > (?, ?) "
            "ORDER BY c.file_id, c.idx LIMIT ?", (*after, limit))
        return [chunk_of(r) for r in rows]

    def evict_chunks(self, chunks: Sequence[tuple[str, int]]) -> None:
        with self.tx():
            self.quotas.refund_chunks(
                "(c.file_id, c.idx) IN (SELECT json_extract(value, '$[0]'), "
                "json_extract(value, '$[1]') FROM json_each(?))", (json.dumps(list(chunks)),))
            self.db.executemany("DELETE FROM cache_chunks WHERE file_id = ? AND idx = ? "
                                "AND crc IS NOT NULL", list(chunks))

    def cache_usage(self) -> dict[str, tuple[int, int, int, int]]:
        # one connection on one thread: nothing writes between the three
        names = [r[0] for r in self.db.execute("SELECT path FROM attachments")]
        files = self.db.execute(
            "SELECT f.attachment, COUNT(*), COALESCE(SUM(e.size), 0) FROM cached_files f "
            "JOIN entries e ON e.file_id = f.file_id GROUP BY f.attachment").fetchall()
        chunks = self.db.execute(
            "SELECT f.attachment, COUNT(*), COALESCE(SUM(c.size), 0) FROM cache_chunks c "
            "JOIN cached_files f ON f.file_id = c.file_id WHERE c.crc IS NOT NULL "
            "GROUP BY f.attachment").fetchall()
        return usage_of(names, files, chunks)
