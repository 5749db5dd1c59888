"""Telemetry reports: a loader tells the metadata server how it is doing.

With ``Loader(job=…)`` (or ``STAGER_JOB`` set, or ``report=True``) a
:class:`Reporter` on the loader's background I/O loop sends a compact summary
of ``stats()`` every ``report_interval`` seconds and once more on ``close()``
(the ``report_rank`` route; see :mod:`stager.protocol.jobreport`), so ``stager
jobs`` and the ``list_jobs`` route show operators which jobs starve.

Reporting never gets in the training loop's way: the reports are built and sent
off the consumer's thread, and a metadata server that is down, slow or answers
an error costs a count in ``stats()["reports_failed"]`` and one log line, never
an exception.  A DataLoader worker reports as its own (rank, worker) entry.

A refusal (403: the loader's token lacks the ``telemetry`` scope on the dataset,
or another token reports the job already) will not change with retrying: the
loader logs it once and reports no more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..client import Client
from ..errors import Forbidden
from ..protocol.jobreport import MAX_INTERVAL, MAX_TARGETS, MIN_INTERVAL, check_job

if TYPE_CHECKING:
    from .loader import Loader

log = logging.getLogger("stager.loader")
FINAL_TIMEOUT = 2.0         # close() waits at most this long for the last report
# environment variables that name the job when reporting is on and no name is given
SCHEDULER_JOB_IDS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "PBS_JOBID")


def job_to_report(report: bool | None, job: str | None, configured: str,
                  env: Mapping[str, str]) -> str | None:
    """The job name to report under, or ``None`` when not reporting.

    On when ``report=True``, or a name is given (``job=`` or ``Config.job``,
    i.e. ``STAGER_JOB``) and ``report`` is not ``False``.  With ``report=True``
    and no name, the scheduler's job id names it (``SLURM_JOB_ID``, …), else
    ``HOST-PID``.
    """
    name = job or configured
    if report is False or (report is None and not name):
        return None
    if not name:
        name = next((env[k] for k in SCHEDULER_JOB_IDS if env.get(k)), "")
        name = name or f"{socket.gethostname()}-{os.getpid()}"
        name = re.sub(r"[^A-Za-z0-9_.:@+=-]", "-", name).lstrip("_.:@+=-")[:128] or "job"
    return check_job(name)


def check_interval(interval: float) -> float:
    if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise ValueError(f"report_interval must be between {MIN_INTERVAL} and "
                         f"{MAX_INTERVAL} seconds, not {interval}")
    return float(interval)


def worst_targets(targets: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The targets with the highest mean latency, worst first."""
    ranked = sorted(targets.items(), key=lambda kv: -kv[1]["mean_latency"])[:MAX_TARGETS]
    return [{"target": t, "requests": c["requests"], "errors": c["errors"],
             "bytes": c["bytes"], "mean_latency": c["mean_latency"]} for t, c in ranked]


def build_report(stats: Mapping[str, Any], identity: Mapping[str, Any]) -> dict[str, Any]:
    """The report body (the wire fields of :mod:`stager.protocol.jobreport`) from ``stats()``."""
    keys = ("samples", "batches", "bytes", "fetches", "stall_seconds", "waiting_seconds",
            "fetch_seconds", "decode_seconds", "samples_per_second", "time_to_first_batch",
            "epoch", "cursor", "reports_failed")
    body = {k: stats[k] for k in keys if stats.get(k) is not None}
    body["stall_fraction"] = min(1.0, max(0.0, stats["stall_fraction"]))
    body["targets"] = worst_targets(stats["targets"])
    body.update(identity)
    return body


class Reporter:
    """Sends one loader's reports from the I/O loop; created in the process that reads.

    It holds the loader weakly: a loader dropped without ``close()`` stops being
    reported (its entry expires on the server) instead of being kept alive.
    """

    def __init__(self, loader: Loader, client: Client, job: str, interval: float) -> None:
        self._loader = weakref.ref(loader)
        self._client = client
        self.job, self.interval = job, interval
        self.timeout = min(max(interval, 1.0), 5.0)   # per report request
        self.rank = loader.rank
        worker, workers = loader.workers
        self.worker = worker if loader.in_worker else None
        self.identity = {"world_size": loader.world_size, "workers": workers,
                         "dataset": loader.source, "format": loader.format,
                         "dataset_samples": len(loader.index), "host": socket.gethostname(),
                         "pid": os.getpid(), "interval": interval,
                         "session": secrets.token_hex(6)}
        self.sent = self.failed = 0
        self.refused = False        # a 403: no more reports from this loader
        self.last_error: str | None = None
        self._seq = 0
        self._prev: tuple[float, int, float] | None = None   # (time, samples, stall)
        self._lock = threading.Lock()
        self._future: cf.Future[None] | None = None

    def counts(self) -> dict[str, Any]:
        return {"report_job": self.job, "reports_sent": self.sent,
                "reports_failed": self.failed, "report_error": self.last_error}

    def start(self) -> None:
        if self._future is None:
            self._future = asyncio.run_coroutine_threadsafe(self._run(), self._client.loop)

    async def _run(self) -> None:
        while await self._send(final=False):
            await asyncio.sleep(self.interval)

    def close(self) -> None:
        """Stop the periodic reports and send the final one (waiting ``FINAL_TIMEOUT`` at
        most).  Never raises: reporting must not break the job's shutdown either."""
        future, self._future = self._future, None
        if future is None:
            return
        future.cancel()         # before the final report is scheduled: it runs first
        coro = self._final()
        try:
            final = asyncio.run_coroutine_threadsafe(coro, self._client.loop)
        except RuntimeError as exc:     # the I/O loop is gone (interpreter shutdown)
            coro.close()
            self._failed(exc)
            return
        try:
            final.result(FINAL_TIMEOUT + 1.0)
        except (Exception, cf.CancelledError) as exc:  # noqa: BLE001 - counted, never raised
            final.cancel()
            self._failed(exc)

    async def _final(self) -> None:
        await asyncio.wait_for(self._send(final=True), FINAL_TIMEOUT)

    def _body(self, loader: Loader, final: bool) -> dict[str, Any]:
        """Built off the loop (``stats()`` walks this pass's plan)."""
        stats = loader.stats()
        with self._lock:
            now = time.monotonic()
            stalled = stats["stall_seconds"] + (
                stats["waiting_seconds"] if stats["time_to_first_batch"] is not None else 0.0)
            body = build_report(stats, self.identity)
            if self._prev is not None and now > self._prev[0]:
                span = now - self._prev[0]
                body["recent_samples_per_second"] = max(0, stats["samples"] - self._prev[1]) \
                    / span
                body["recent_stall_fraction"] = min(1.0, max(0.0, stalled - self._prev[2])
                                                    / span)
            self._prev = (now, stats["samples"], stalled)
            self._seq += 1
            body.update(seq=self._seq, final=final)
        return body

    async def _send(self, final: bool) -> bool:
        """One report; False once the loader is gone or reports are refused."""
        loader = self._loader()
        if loader is None or self.refused:
            return False
        try:
            body = await asyncio.to_thread(self._body, loader, final)
            del loader          # the request below must not keep it alive
            await self._client.aio.report_job(self.job, self.rank, body, worker=self.worker,
                                              timeout=self.timeout)
        except Forbidden as exc:
            self._refused(exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a failed report is counted, not raised
            self._failed(exc)
        else:
            self.sent += 1
            if self.last_error is not None:
                log.info("loader telemetry for job %s reaches the metadata server again",
                         self.job)
                self.last_error = None
        return True

    def _refused(self, exc: Forbidden) -> None:
        self.failed += 1
        self.refused = True
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("loader telemetry for job %s (rank %s) refused: %s; this loader reports "
                    "no more (its token needs the telemetry scope on the dataset, e.g. "
                    "`stager token create --scope read --scope telemetry`), and goes on",
                    self.job, self.rank, exc)

    def _failed(self, exc: BaseException) -> None:
        self.failed += 1
        first = self.last_error is None
        self.last_error = f"{type(exc).__name__}: {exc}"
        # once per outage, so a dead metadata server does not flood the job's log
        (log.warning if first else log.debug)(
            "loader telemetry for job %s (rank %s) not delivered: %s; counted in "
            "stats()['reports_failed'], the loader goes on", self.job, self.rank,
            self.last_error)
