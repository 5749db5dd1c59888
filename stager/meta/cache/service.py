"""The cache's parts on one metadata server, and the duty holder's upkeep of them."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StagerError
from ..auth import AUTH_DIR
from .attach import Attachments
from .evict import Evictor
from .fill import Filler
from .secrets import OptionsBox
from .sources import Sources

if TYPE_CHECKING:
    from ...config import Config
    from ...dataplane import DataPlane
    from ..service import MetaService

log = logging.getLogger(__name__)


class CacheService:
    def __init__(self, service: MetaService, config: Config,
                 plane: Callable[[], DataPlane]) -> None:
        auth_dir = config.auth_dir or str(Path(config.root) / AUTH_DIR)
        self.sources = Sources(OptionsBox.under(auth_dir), [config.root, auth_dir])
        self.attachments = Attachments(service, self.sources)
        holder = f"{config.public_url}#{secrets.token_hex(4)}"
        self.evictor = Evictor(service, plane)
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

    async def close(self) -> None:
        await self.sources.close()
