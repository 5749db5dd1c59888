"""Epoch plans: which sample every rank reads at every step, as pure functions.

A Loader's order (:mod:`.order`), its partition among ranks and workers
(:mod:`.partition`) and the chunk reads they add up to (:mod:`.accesses`) are
functions of a handful of parameters (seed, epoch, world size, batch size, the
dataset's blocks).  They live here, below both the Loader and the servers,
because both need them: the Loader to read, the metadata server to derive
every registered job's future reads for plan-aware eviction and prefetch.
Servers may not import ``loader/`` (the README's layering sentence), so the
plan functions may not live there.
"""
