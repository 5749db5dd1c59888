"""The cache's parts on one metadata server, and the duty holder's upkeep of them."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StagerError
from ...protocol.cache import Filled, FillItem
from ..auth import AUTH_DIR
from .attach import Attachments
from .evict import Evictor
from .fill import Filler
from .plans import PlanBook
from .secrets import OptionsBox
from .sources import Sources

if TYPE_CHECKING:
    from ...config import Config
    from ...dataplane import DataPlane
    from ..service import MetaService

log = logging.getLogger(__name__)
PREFETCH_STEPS = 8          # steps of the registered plans filled ahead of their jobs
PREFETCH_CHUNKS = 64        # at most this many chunks looked at a round


class CacheService:
    def __init__(self, service: MetaService, config: Config,
                 plane: Callable[[], DataPlane]) -> None:
        auth_dir = config.auth_dir or str(Path(config.root) / AUTH_DIR)
        self.sources = Sources(OptionsBox.under(auth_dir), [config.root, auth_dir])
        self.attachments = Attachments(service, self.sources)
        holder = f"{config.public_url}#{secrets.token_hex(4)}"
        self.plans = PlanBook(service)
        self.evictor = Evictor(service, plane, self.plans.next_use)
        self.filler = Filler(service, self.sources, plane, self.evictor, holder=holder,
                             concurrency=config.fill_concurrency)
        self.service = service

    async def status_sections(self) -> dict[str, Any]:
        return {"attachments": [a.to_json() for a in await self.attachments.list()]}

    async def upkeep(self) -> None:
        """The duty holder's round: attachments due for a listing are listed again,
        and filled bytes are kept under the limit."""
        for record in await self.attachments.due(self.service.clock()):
            try:
                await self.attachments.refresh(record.path)
            except StagerError as exc:
                log.warning("refresh of %s from %s failed: %s", record.path, record.source,
                            exc)
        await self.evictor.round()
        await self.prefetch()

    async def prefetch(self) -> int:
        """Fill what the registered plans read in their next ``PREFETCH_STEPS`` steps
        (at most ``PREFETCH_CHUNKS`` chunks a round): chunks filled already cost a
        look in the store; the others are fetched once, as a reader's fill would be
        (a reader asking meanwhile waits for the same fetch).  Chunks fetched."""
        keys = (await self.plans.ahead(PREFETCH_STEPS))[:self._prefetch_chunks()]
        if not keys:
            return 0
        items: dict[str, list[int]] = {}
        for file_id, index in keys:
            items.setdefault(file_id, []).append(index)
        answers = await self.filler.fill([FillItem(f, tuple(c)) for f, c in items.items()],
                                         lambda path: True, touch=False)
        return sum(len(a.fetched) for a in answers if isinstance(a, Filled))

    def _prefetch_chunks(self) -> int:
        """Chunks a prefetch round may look at: ``PREFETCH_CHUNKS``, and under a cache
        limit no more than a quarter of it (in chunks of the configured size), so that
        filling ahead never pushes out what the ranks are reading now."""
        limit = self.service.config.cache_limit
        if limit <= 0:
            return PREFETCH_CHUNKS
        return max(0, min(PREFETCH_CHUNKS, limit // 4 // self.service.config.chunk_size))

    async def close(self) -> None:
        await self.filler.close()
        await self.sources.close()
