"""``stager warm PATH --plan seed=S,world=W,epoch=E``: the chunks a Loader plan reads,
first reads first.

The dataset is indexed as a Loader of ``PATH`` indexes it (format ``auto``), its
order and partition drawn as the Loader draws them (the default shuffle, its
blocks and window), and every rank's reads of epoch ``E`` listed in time order by
the functions the metadata server uses for plan-aware eviction
(:func:`stager.plans.registered.registered_accesses`).  Warming in that order
fills what the job reads first before what it reads last: a warm stopped early
(or a cache smaller than the dataset) still serves the job's first steps.
"""

from __future__ import annotations

import numpy as np

from ..client import AsyncClient
from ..client.warm import Chunk, PlanSpec
from ..plans.registered import Dataset, Plan, registered_accesses
from . import formats
from .dataset import resolve
from .planreg import dataset_extents


async def plan_order(client: AsyncClient, path: str, spec: PlanSpec) -> list[Chunk]:
    """The chunks of cached files the plan ``spec`` reads in epoch ``spec.epoch``, each
    once, in the order of their first read."""
    source = await resolve(client, path)
    index = await formats.builder(formats.detect(source))(client, source, {})
    extents = dataset_extents(index)
    if extents is None:
        raise ValueError(f"{path}: too many samples to work out a plan's order")
    blocks = index.block_starts()
    window = max(1, int(round(8 * len(index) / max(1, len(blocks)))))
    plan = Plan(seed=spec.seed, epoch=spec.epoch, world_size=spec.world,
                batch_size=spec.batch, window=window, blocks=np.asarray(blocks), epochs=1,
                order="window_of_blocks", drop_last=False)
    dataset = Dataset(tuple(extents["files"]), tuple(extents["chunk_sizes"]),
                      extents["samples"], extents["sample"], extents["file"],
                      extents["offset"], extents["length"])
    keys = registered_accesses(plan, dataset).key
    _, first = np.unique(keys, return_index=True)
    files = {f.file_id: f for f in index.files}
    out: list[Chunk] = []
    for key in keys[np.sort(first)].tolist():
        file_id, chunk = dataset.name(key)
        info = files.get(file_id)
        if info is not None and info.layout is not None and info.layout.cached:
            out.append((info, chunk))
    return out
