"""Rebuild, repair, scrub and fsck on the metadata server: wiring, routes, status.

:func:`install` adds them to the metadata application: one chunk copier shared
by rebuild and repair (so ``rebuild_rate`` bounds both), the background tasks
(lost-target detection and rebuild, the repair queue, the periodic fsck), their
sections of the ``status`` route, and the handlers of the ``remove_target``,
``scrub``, ``scrub_report`` and ``fsck`` routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from aiohttp import web

from ...aio import cancel_and_wait
from ...config import Config
from ...dataplane import DataPlane
from ...protocol.cluster import ScrubQueued
from ...protocol.messages import FsckRequest, ScrubReport, ScrubRequest
from ...protocol.models import TargetInfo
from ...web.authmw import speak_for
from ...web.middleware import json_response
from ...web.requests import read_json
from ..service import GONE_STATES, MetaService
from .copier import ChunkCopier
from .fsck import Fsck
from .rebuild import Rebuilder
from .repair import Repairer

log = logging.getLogger("stager.meta")


class Reliability:
    def __init__(self, service: MetaService, config: Config,
                 plane: Callable[[], DataPlane]) -> None:
        self.service = service
        self.config = config
        self.copier = ChunkCopier(plane, service.targets.get, rate=config.rebuild_rate,
                                  concurrency=config.rebuild_concurrency,
                                  draining=self._answers, suspect=service.suspect)
        self.rebuilder = Rebuilder(service, self.copier, config)
        self.repairer = Repairer(service, self.copier, plane)
        self.fsck = Fsck(service, self.rebuilder, self.repairer, plane)
        service.status_extras.append(self.status)

    def _answers(self, target: TargetInfo) -> bool:
        """Whether a target heartbeat recently (whatever its state)."""
        return self.service.clock() - target.last_heartbeat < self.config.target_timeout

    def status(self) -> dict[str, Any]:
        # Rebuild and fsck run on the server holding the duties; another shows what
        # that one stored (stager/meta/shared.py).
        here = self.service.duties_held
        shared = self.service.shared_status
        return {
            "targets_lost": sum(t.state in GONE_STATES
                                for t in self.service.targets.values()),
            "rebuild": (self.rebuilder.progress.to_json() if here or "rebuild" not in shared
                        else shared["rebuild"]),
            "repair": self.repairer.status(),
            "fsck": self.fsck.status() if here or "fsck" not in shared else shared["fsck"],
        }

    async def fsck_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.fsck_interval)
            if not self.service.duties_held:     # another metadata server runs it
                continue
            try:
                result = await self.fsck.run(repair=True)
                await self.service.share_status("fsck", self.fsck.status())
                if result.missing or result.orphans_deleted:
                    log.info("fsck: %d missing (%d repaired), %d orphans (%d deleted)",
                             result.missing, result.repaired, result.orphans,
                             result.orphans_deleted)
            except Exception:
                log.exception("background fsck failed; will retry")

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        tick = min(self.config.gc_interval, self.config.heartbeat_interval)
        jobs = [self.rebuilder.run(tick), self.repairer.run()]
        if self.config.fsck_interval > 0:
            jobs.append(self.fsck_forever())
        return jobs


RELIABILITY = web.AppKey("reliability", Reliability)


def install(app: web.Application, service: MetaService, config: Config,
            plane: Callable[[], DataPlane]) -> Reliability:
    """Give the metadata application rebuild, repair, scrub and fsck."""
    reliability = Reliability(service, config, plane)
    app[RELIABILITY] = reliability

    async def background(app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(job) for job in reliability.tasks()]
        yield
        await cancel_and_wait(tasks)

    app.cleanup_ctx.append(background)
    return reliability


def _get(request: web.Request) -> Reliability:
    return request.app[RELIABILITY]


async def _body(request: web.Request) -> dict[str, Any]:
    return await read_json(request, _get(request).config.max_json_body)


async def remove_target(request: web.Request) -> web.Response:
    target = await _get(request).rebuilder.declare_lost(
        request.match_info["target_id"], "removed by an operator", state="removed")
    return json_response(target.to_json())


async def scrub(request: web.Request) -> web.Response:
    req = ScrubRequest.from_json(await _body(request))
    return json_response((await _get(request).repairer.scrub_cluster(req.rate)).to_json())


async def scrub_report(request: web.Request) -> web.Response:
    report = ScrubReport.from_json(await _body(request))
    speak_for(request, report.target)
    queued = _get(request).repairer.report(report.target, list(report.chunks))
    return json_response(ScrubQueued(queued).to_json())


async def fsck(request: web.Request) -> web.Response:
    req = FsckRequest.from_json(await _body(request))
    reliability = _get(request)
    result = await reliability.fsck.run(repair=req.repair)
    await reliability.service.share_status("fsck", reliability.fsck.status())
    return json_response(result.to_json())


HANDLERS = {"remove_target": remove_target, "scrub": scrub, "scrub_report": scrub_report,
            "fsck": fsck}
