"""What a data server is shown: capabilities, in the ``X-Stager-Capability`` header.

The data plane asks its :class:`Credentials` for the header of every request to
a data server, naming the operation and the files it touches.  Two kinds:

- the metadata server's own (:class:`ClusterCredential`): one ``cluster``
  capability for everything (rebuild copies, purges, scrubs, the gateway);
- a client's: :class:`stager.client.capabilities.CapabilityBook`, which keeps
  the capabilities the metadata server handed out per file and fetches the
  missing ones before they are needed.

With auth off a plane has no credentials and sends no header.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol


class Credentials(Protocol):
    async def header(self, op: str, file_ids: Collection[str]) -> str | None:
        """The ``X-Stager-Capability`` value for ``op`` ("read", "write" or "cluster")
        on chunks of ``file_ids``; ``None`` for no header."""
        ...


class ClusterCredential:
    """The metadata server's capability, from ``mint`` (which reuses one while it is
    fresh): it covers every file and the maintenance routes."""

    def __init__(self, mint: Callable[[], str]) -> None:
        self.mint = mint

    async def header(self, op: str, file_ids: Collection[str]) -> str | None:
        return self.mint()
