"""Progress of a staging run: a live bar on a terminal, nothing otherwise.

The run reports through :class:`Progress`; :func:`make_progress` picks the
rich bar (files, bytes, rate, ETA) when asked and stderr is a terminal.
"""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """Silent progress: counts only (the base of every reporter)."""

    def __init__(self) -> None:
        self.files_total = 0
        self.bytes_total = 0
        self.files_done = 0
        self.bytes_done = 0

    def start(self, files: int, nbytes: int) -> None:
        self.files_total, self.bytes_total = files, nbytes

    def add_total(self, nbytes: int) -> None:
        """Bytes of a file whose size the listing did not tell (http) join the total."""
        self.bytes_total += nbytes

    def advance(self, nbytes: int) -> None:
        self.bytes_done += nbytes

    def file_done(self, skipped_bytes: int = 0) -> None:
        """One file finished; ``skipped_bytes`` counts a file skipped as unchanged."""
        self.files_done += 1
        self.bytes_done += skipped_bytes

    def stop(self) -> None:
        pass


class RichProgress(Progress):
    """A rich progress bar on stderr: files done/total, bytes, rate and ETA."""

    def __init__(self, description: str, *, files: bool = True) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as Bar

        counted = [TextColumn("{task.fields[files]} files")] if files else []
        self._bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), *counted,
                        DownloadColumn(binary_units=True), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self._description = description
        self._bytes_task: Any = None

    def start(self, files: int, nbytes: int) -> None:
        super().start(files, nbytes)
        self._bar.start()
        self._bytes_task = self._bar.add_task(self._description, total=nbytes,
                                              files=f"0/{files}")

    def add_total(self, nbytes: int) -> None:
        super().add_total(nbytes)
        self._bar.update(self._bytes_task, total=self.bytes_total)

    def advance(self, nbytes: int) -> None:
        super().advance(nbytes)
        self._bar.update(self._bytes_task, advance=nbytes)

    def file_done(self, skipped_bytes: int = 0) -> None:
        super().file_done(skipped_bytes)
        self._bar.update(self._bytes_task, advance=skipped_bytes,
                         files=f"{self.files_done}/{self.files_total}")

    def stop(self) -> None:
        self._bar.stop()


def make_progress(show: bool | None, url: str, *, label: str | None = None,
                  files: bool = True) -> Progress:
    """``show=None`` means: a bar when stderr is a terminal.  ``label``: the bar's text
    (else the end of ``url``); ``files``: whether it counts files too."""
    if show is None:
        show = sys.stderr.isatty()
    return RichProgress(label or _short(url), files=files) if show else Progress()


def _short(url: str, width: int = 24) -> str:
    """The last part of ``url``, so that the bar's numbers fit on the line."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or url
    return name if len(name) <= width else "…" + name[-(width - 1):]
