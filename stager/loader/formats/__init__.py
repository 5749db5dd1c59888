"""Dataset formats, registered by name; ``detect`` picks one for ``format="auto"``."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..dataset import Dataset
from .base import Index

Builder = Callable[[Any, Dataset, dict[str, Any]], Awaitable[Index]]

#: format name -> "module:function" building its index (imported on first use,
#: so reading tar shards never imports zarr)
FORMATS: dict[str, str] = {
    "files": "perfile:build_files",
    "tar": "tar:build_tar",
    "parquet": "parquet:build_parquet",
    "zarr": "zarr:build_zarr",
}


def builder(name: str) -> Builder:
    try:
        target = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {sorted(FORMATS)}") from None
    module, func = target.split(":")
    fn: Builder = getattr(importlib.import_module(f"{__name__}.{module}"), func)
    return fn


def _visible(rel: str) -> bool:
    return not any(part.startswith((".", "_")) for part in rel.split("/"))


def detect(source: Dataset) -> str:
    """``zarr`` for an array directory, ``tar`` or ``parquet`` when every visible
    file has that suffix, else ``files``."""
    names = source.names()
    if source.is_dir and ("zarr.json" in names or ".zarray" in names):
        return "zarr"
    visible = [n for n in names if _visible(n)] or names
    if visible and all(n.endswith(".tar") for n in visible):
        return "tar"
    if visible and all(n.endswith((".parquet", ".pq")) for n in visible):
        return "parquet"
    return "files"


__all__ = ["FORMATS", "Index", "builder", "detect"]
