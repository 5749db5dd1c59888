"""Polls the filled bytes of attached directories while a test reads (a background
thread): the most it saw, for tests that check a cache never passed its limit."""

from __future__ import annotations

import threading
import time

from ..client import Client

POLL = 0.02         # seconds between looks


class FilledWatch:
    """``with FilledWatch(client, path) as w: …`` then ``w.most``: the most bytes filled
    under attached directory ``path`` (every attached directory when ``None``)."""

    def __init__(self, client: Client, path: str | None = None) -> None:
        self.client, self.path = client, path
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            filled = sum(a.cached_bytes for a in self.client.attachments()
                         if self.path is None or a.path == self.path)
            self.most = max(self.most, filled)
            time.sleep(POLL)

    def __enter__(self) -> FilledWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
