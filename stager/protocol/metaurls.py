"""A list of metadata servers, as ``--meta``, ``STAGER_META_URL``, ``Client(...)``
and ``stager://`` hosts give it: ``http://a:7070,http://b:7070`` or a sequence.

Every metadata server of a cluster serves the same store, so any of them answers
any request; clients try them in order and stay with the first that answers.
"""

from __future__ import annotations

from collections.abc import Sequence


def meta_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """The metadata servers ``value`` names, in order, without trailing slashes or
    repeats: a comma-separated string or a sequence of them."""
    parts = value.split(",") if isinstance(value, str) else \
        [p for item in value for p in item.split(",")]
    urls: list[str] = []
    for part in parts:
        url = part.strip().rstrip("/")
        if url and url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError(f"no metadata server URL in {value!r}")
    return tuple(urls)


def joined(urls: Sequence[str]) -> str:
    """``urls`` as one comma-separated string (what ``meta_url`` holds)."""
    return ",".join(urls)


def from_hosts(netloc: str, scheme: str = "http") -> str:
    """The metadata servers of a ``stager://`` URL's hosts, ``a:7070,b:7070``."""
    return joined([h if "://" in h else f"{scheme}://{h}" for h in meta_urls(netloc)])
