"""stager: a striped data-staging service for AI training.

``stager.Client`` / ``stager.AsyncClient`` talk to a cluster; see the README.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

__all__ = ["AsyncClient", "Client", "Loader", "__version__"]

if TYPE_CHECKING:
    from .client import AsyncClient, Client
    from .loader import Loader


def __getattr__(name: str) -> Any:
    # Lazy, so that servers importing stager.errors do not pull in the client.
    if name in ("AsyncClient", "Client"):
        from . import client

        return getattr(client, name)
    if name == "Loader":
        from .loader import Loader

        return Loader
    raise AttributeError(f"module 'stager' has no attribute {name!r}")
