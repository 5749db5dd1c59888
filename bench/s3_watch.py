"""What ``bench s3`` watches around each case: the gateway's memory, the metadata
server's requests, every process's CPU; and the file object ``download_fileobj``
writes into."""

from __future__ import annotations

import io
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .common import KiB, cpu_seconds, median


class BufferFile(io.RawIOBase):
    """A seekable writable file over a preallocated buffer (``download_fileobj``'s
    target: it seeks to each part's offset and writes it there)."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0
        self.written = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = offset + (self.pos if whence == io.SEEK_CUR else
                             len(self.buf) if whence == io.SEEK_END else 0)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, data: Any) -> int:
        n = len(data)
        self.buf[self.pos:self.pos + n] = data
        self.pos += n
        self.written += n
        return n


class Gateway:
    """The gateway process's peak resident memory over one case, from ``/proc``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peaks: dict[str, list[int]] = {}

    def rss(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * KiB
        raise RuntimeError(f"no {field} for pid {self.pid}")

    @contextmanager
    def watch(self, case: str) -> Iterator[None]:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")    # VmHWM := VmRSS
        yield
        self.peaks.setdefault(case, []).append(self.rss("VmHWM"))


class MetaRequests:
    """The metadata server's requests each case caused, by operation and status (its
    ``/metrics`` counters; heartbeats and the scrapes themselves left out)."""

    def __init__(self, meta_url: str) -> None:
        self.url = meta_url
        self.seen: dict[str, Counter[str]] = {}

    def now(self) -> Counter[str]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as answer:
            text = answer.read().decode()
        out: Counter[str] = Counter()
        for m in re.finditer(r'^stager_requests_total\{op="([^"]+)",status="(\d+)"\} (\S+)$',
                             text, re.M):
            if m[1] not in ("heartbeat", "metrics"):
                out[f"{m[1]} {m[2]}"] += int(float(m[3]))
        return out

    @contextmanager
    def watch(self, case: str) -> Iterator[None]:
        before = self.now()
        yield
        if case not in self.seen:           # the first round's: the same every round
            self.seen[case] = self.now() - before

    def line(self, case: str, per: float, unit: str) -> str:
        got = self.seen[case]
        return f"{case}: " + (", ".join(f"{k} {v / per:.1f}" for k, v in sorted(got.items()))
                              or "none") + f" per {unit}"


class Cpu:
    """CPU seconds each case cost the gateway, the stager servers (data and metadata)
    and this process (the clients, moto's server too), from ``/proc``."""

    def __init__(self, gateway: int, servers: list[int]) -> None:
        self.gateway, self.servers = gateway, servers
        self.spent: dict[str, list[tuple[float, float, float]]] = {}

    def now(self) -> tuple[float, float, float]:
        return (cpu_seconds(self.gateway), sum(cpu_seconds(p) for p in self.servers),
                time.process_time())

    @contextmanager
    def watch(self, case: str) -> Iterator[None]:
        before = self.now()
        yield
        after = self.now()
        self.spent.setdefault(case, []).append(
            tuple(b - a for a, b in zip(before, after, strict=True)))  # type: ignore[arg-type]

    def total(self, case: str) -> float:
        """The median over the rounds of all three together."""
        return median([sum(c) for c in self.spent[case]])

    def bound(self, case: str, base: str) -> str:
        """What the case's rate over ``base``'s would be if both were bound by CPU
        alone (two cores shared by every process here): the inverse of their CPU."""
        return (f"{case} / {base}: {self.total(base) / self.total(case):.2f} "
                f"(gateway {median([c[0] for c in self.spent[case]]) / self.total(case):.0%} "
                "of the S3 path's CPU)")

    def line(self, case: str, per: float, unit: str) -> str:
        each = self.spent[case]
        med = [median([c[i] for c in each]) / per for i in range(3)]
        return (f"{case}: gateway {med[0]:.2f}, servers {med[1]:.2f}, this process "
                f"{med[2]:.2f} CPU s per {unit}")
