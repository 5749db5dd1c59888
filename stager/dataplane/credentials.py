"""What a data server is shown: capabilities, in the ``X-Stager-Capability`` header.

The data plane asks its :class:`Credentials` for the header of every request to
a data server, naming the operation and the files it touches.  Two kinds:

- the metadata server's own (:class:`ServerCredential`): for every file, but
  each for one operation on the one target it is sent to (rebuild copies, purges,
  scrubs, listings, the gateway), so a target that receives one cannot use it
  against another;
- a client's: :class:`stager.client.capabilities.CapabilityBook`, which keeps
  the capabilities the metadata server handed out per file and fetches the
  missing ones before they are needed.

With auth off a plane has no credentials and sends no header.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol


class Credentials(Protocol):
    async def header(self, op: str, file_ids: Collection[str],
                     target: str | None = None) -> str | None:
        """The ``X-Stager-Capability`` value for ``op`` ("read", "write" or "cluster")
        on chunks of ``file_ids`` on ``target``; ``None`` for no header."""
        ...

    async def plan(self, op: str, file_ids: Sequence[str]) -> None:
        """Have at hand, before the requests go out, what :meth:`header` will need for
        ``op`` on ``file_ids`` (a read plan's files, each data server's together)."""
        ...


class ServerCredential:
    """The metadata server's capabilities, from ``mint(op, target)`` (which reuses
    one while it is fresh): every file, one operation, one target."""

    def __init__(self, mint: Callable[[str, str], str]) -> None:
        self.mint = mint

    async def header(self, op: str, file_ids: Collection[str],
                     target: str | None = None) -> str | None:
        return None if target is None else self.mint(op, target)

    async def plan(self, op: str, file_ids: Sequence[str]) -> None:
        return None         # minted when asked: nothing to fetch
