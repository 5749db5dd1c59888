"""``Cluster``: where a stager cluster is and how to talk to it, resolved once.

``Client``, ``AsyncClient``, the ``stager://`` filesystem, ``Loader`` and the mount
take ``(meta_url, config, token)`` or this value resolved from them (``cluster=``),
and pass it down to what they build.  It pickles: an unpickled Loader's client is
made from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config import Config, load_config
from ..protocol.metaurls import joined, meta_urls


@dataclass(frozen=True)
class Cluster:
    """The metadata servers ``urls`` (one store; tried in order), the ``config``
    (with those URLs and the token applied: settings, TLS ``ca_file``, timeouts) and
    the ``headers`` every request carries (``Authorization`` with a token, read once)."""

    urls: tuple[str, ...]
    config: Config
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def resolve(cls, meta_url: str | Sequence[str] | None = None, *,
                config: Config | None = None, token: str | None = None,
                cluster: Cluster | None = None) -> Cluster:
        """``meta_url`` (one URL, several comma-separated, or a sequence; default
        ``config.meta_url``), ``config`` (default: :func:`~stager.config.load_config`)
        and a bearer ``token`` (replacing the config's) resolved; or ``cluster``, one
        resolved already, as it is."""
        if cluster is not None:
            if meta_url is not None or config is not None or token is not None:
                raise TypeError("give either cluster= or meta_url, config and token")
            return cluster
        config = config or load_config()
        urls = meta_urls(meta_url or config.meta_url)
        config = config.replace(meta_url=joined(urls), token=token)   # token None: kept
        return cls(urls, config, config.auth_headers())

    @property
    def meta_url(self) -> str:
        """Every metadata server, comma-separated."""
        return joined(self.urls)
