"""Fault 3: flipped bytes and truncated chunk files.

Each damaged copy is detected by the first read that touches it (100%), the
read is served from the other replica, and ``stager scrub`` repairs every
damaged copy; a chunk whose every copy is damaged is a clear CorruptChunk.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import start_cluster
from reliability_util import replicas_on_disk, target_roots

from faults.faultlib import SMALL, damage, make_bytes
from stager import AsyncClient
from stager.config import load_config
from stager.errors import CorruptChunk
from stager.layout import chunk_targets
from stager.protocol.models import LayoutSpec

pytestmark = pytest.mark.faults
FILES, CHUNKS, DAMAGED = 8, 6, 16


async def test_damaged_copies_are_detected_served_around_and_scrubbed(
        tmp_path: Path, slow_callbacks, figures: dict[str, Any]) -> None:
    # No background scrub: every detection below is the read's own, every repair scrub's.
    cluster = start_cluster(tmp_path, 3, replicas=2, scrub_interval=0, fsck_interval=0)
    rng = random.Random(3)
    try:
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            bodies = {}
            for f in range(FILES):
                path = f"/c/f{f}.bin"
                bodies[path] = make_bytes(path, CHUNKS * SMALL)
                await c.pipe(path, bodies[path], layout=LayoutSpec(chunk_size=SMALL,
                                                                  stripe_count=3))
            infos = {p: await c.stat(p, cached=False) for p in bodies}
        roots = target_roots(tmp_path, 3)
        picks = rng.sample([(p, i) for p in bodies for i in range(CHUNKS)], DAMAGED)
        damaged = []
        for n, (path, index) in enumerate(picks):
            # the primary copy: the one a read tries first
            how = "flip" if (n // 2) % 2 else "truncate"    # each with both kinds of read
            damaged.append((path, index, damage(roots, infos[path], index, 0, how)))
        detected = served = 0
        for n, (path, index, target) in enumerate(damaged):
            # a fresh client each time, so its counters see this read alone
            async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
                start = index * SMALL
                # even: the whole chunk (checked by the client against the committed CRC);
                # odd: a range (checked block by block by the data server)
                stop = start + (SMALL if n % 2 == 0 else 1000)
                got = await c.cat(path, start + (0 if n % 2 == 0 else 5000),
                                  stop + (0 if n % 2 == 0 else 5000))
                want = bodies[path][start:stop] if n % 2 == 0 else \
                    bodies[path][start + 5000:stop + 5000]
                served += got == want
                detected += c.plane.counters.get(target, None) is not None and \
                    c.plane.counters[target].errors >= 1
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            scrub = await c.scrub()
            after = [p for path, info in infos.items() for p in replicas_on_disk(roots, info)]
            # every copy of one chunk damaged: an error, never wrong bytes
            path, info = "/c/f0.bin", infos["/c/f0.bin"]
            assert info.layout is not None
            for copy in range(len(chunk_targets(info.layout, 1))):
                damage(roots, info, 1, copy, "flip")
            with pytest.raises(CorruptChunk):
                await c.cat(path)
            second = await c.scrub()
    finally:
        cluster.stop()
    figures.update(damaged_copies=DAMAGED, detected_on_read=detected,
                   served_from_replica=served, scrub_checked=scrub["checked"],
                   scrub_corrupt=scrub["corrupt"], scrub_repaired=scrub["repaired"],
                   scrub_seconds=scrub["seconds"], copies_bad_after_scrub=len(after),
                   all_copies_bad_unrecoverable=second["unrecoverable"])
    assert detected == served == DAMAGED                     # 100%
    assert scrub["corrupt"] == scrub["repaired"] == DAMAGED and scrub["unrecoverable"] == 0
    assert after == [], after[:5]
    assert second["unrecoverable"] == 2 and second["repaired"] == 0
