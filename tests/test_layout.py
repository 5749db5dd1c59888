"""Chunks land where the layout says; layouts are inherited from directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.errors import InvalidLayout, NoTargets
from stager.layout import choose_layout, chunk_length, chunk_slots, chunk_targets, pieces
from stager.protocol.models import Layout, LayoutSpec, TargetInfo
from stager.testing import ThreadCluster

SMALL = 64 * 1024


def stored_chunks(cluster: ThreadCluster) -> dict[str, set[str]]:
    """Target id → names of the chunk files in that data server's directory."""
    out = {}
    for i in range(cluster.n):
        root = cluster.root / f"data{i}" / "chunks"
        out[cluster.target_id(i)] = {p.name for p in root.rglob("*") if p.is_file()}
    return out


def chunk_path(cluster: ThreadCluster, target: str, file_id: str, index: int) -> Path:
    i = next(i for i in range(cluster.n) if cluster.target_id(i) == target)
    return (cluster.root / f"data{i}" / "chunks" / file_id[:2] / file_id[2:4]
            / f"{file_id}.{index}")


def test_chunks_land_on_the_layout_targets(client: Client, cluster: ThreadCluster, ns: str,
                                           payload) -> None:
    info = client.pipe(f"{ns}/f.bin", payload(SMALL * 10 + 1),
                       layout=LayoutSpec(chunk_size=SMALL))
    lay, fid = info.layout, info.file_id
    assert lay is not None and fid is not None
    assert lay.stripe_count == 3 and len(set(lay.targets)) == 3   # default: all targets
    stored = stored_chunks(cluster)
    for index in range(11):
        name = f"{fid}.{index}"
        expected = {lay.targets[index % lay.stripe_count]}
        assert chunk_targets(lay, index) == list(expected)
        holders = {t for t, names in stored.items() if name in names}
        assert holders == expected, (index, holders)
        [target] = expected
        path = chunk_path(cluster, target, fid, index)
        # data + one CRC per 64 KiB block + a 24-byte footer
        length = chunk_length(SMALL, info.size, index)
        assert path.stat().st_size == length + 4 * -(-length // SMALL) + 24
    assert not any(f"{fid}.11" in names for names in stored.values())


def test_stripe_count_limits_the_targets(client: Client, cluster: ThreadCluster, ns: str,
                                         payload) -> None:
    info = client.pipe(f"{ns}/s.bin", payload(SMALL * 6),
                       layout=LayoutSpec(chunk_size=SMALL, stripe_count=2))
    assert info.layout is not None and info.layout.stripe_count == 2
    stored = stored_chunks(cluster)
    used = {t for t, names in stored.items() if any(n.startswith(info.file_id or "?")
                                                     for n in names)}
    assert used == set(info.layout.targets)
    # RAID-0: chunk i on targets[i % 2], so each target holds every other chunk.
    for slot, target in enumerate(info.layout.targets):
        mine = {n for n in stored[target] if n.startswith(f"{info.file_id}.")}
        assert mine == {f"{info.file_id}.{i}" for i in range(slot, 6, 2)}


def test_replicas_land_on_distinct_nodes(client: Client, cluster: ThreadCluster, ns: str,
                                         payload) -> None:
    data = payload(SMALL * 7 + 3)
    info = client.pipe(f"{ns}/r.bin", data, layout=LayoutSpec(chunk_size=SMALL, replicas=2))
    lay = info.layout
    assert lay is not None and lay.replicas == 2
    stored = stored_chunks(cluster)
    node_of = dict(zip(lay.targets, lay.nodes, strict=True))
    for index in range(8):
        holders = {t for t, names in stored.items() if f"{info.file_id}.{index}" in names}
        assert holders == set(chunk_targets(lay, index))
        assert len(holders) == 2
        assert len({node_of[t] for t in holders}) == 2
    assert client.cat(f"{ns}/r.bin") == data


def test_more_replicas_than_nodes_is_refused(client: Client, ns: str) -> None:
    with pytest.raises(ConnectionError) as err:       # NoTargets is a 503 Unavailable
        client.pipe(f"{ns}/x.bin", b"x", layout=LayoutSpec(replicas=4))
    assert isinstance(err.value, NoTargets)
    assert not client.exists(f"{ns}/x.bin")


def test_directory_layout_is_inherited_and_overridden(client: Client, ns: str) -> None:
    client.mkdir(f"{ns}/d", layout=LayoutSpec(chunk_size=128 * 1024, stripe_count=2))
    assert client.stat(f"{ns}/d", cached=False).default_layout == \
        LayoutSpec(chunk_size=128 * 1024, stripe_count=2)
    a = client.pipe(f"{ns}/d/a.bin", b"a" * 10)
    assert a.layout is not None
    assert (a.layout.chunk_size, a.layout.stripe_count, a.layout.replicas) == (128 * 1024, 2, 1)
    # nested directories inherit; the nearest directory wins field by field
    client.mkdir(f"{ns}/d/e/f", layout=LayoutSpec(replicas=2))
    b = client.pipe(f"{ns}/d/e/f/b.bin", b"b")
    assert b.layout is not None
    assert (b.layout.chunk_size, b.layout.stripe_count, b.layout.replicas) == (128 * 1024, 2, 2)
    # a per-write layout overrides only the fields it sets
    c = client.pipe(f"{ns}/d/c.bin", b"c", layout=LayoutSpec(chunk_size=SMALL))
    assert c.layout is not None
    assert (c.layout.chunk_size, c.layout.stripe_count) == (SMALL, 2)
    # setstripe on an existing directory: new files follow, old files keep theirs
    client.set_layout(f"{ns}/d", LayoutSpec(stripe_count=1))
    g = client.pipe(f"{ns}/d/g.bin", b"g")
    assert g.layout is not None and g.layout.stripe_count == 1
    assert g.layout.chunk_size == 4 * 1024 * 1024   # chunk_size no longer set on d
    assert client.stat(f"{ns}/d/a.bin", cached=False).layout == a.layout
    # a directory outside keeps the defaults
    h = client.pipe(f"{ns}/h.bin", b"h")
    assert h.layout is not None and h.layout.chunk_size == 4 * 1024 * 1024
    assert h.layout.stripe_count == 3


def test_invalid_layouts_are_refused(client: Client, ns: str) -> None:
    for spec in (LayoutSpec(chunk_size=1000), LayoutSpec(replicas=0),
                 LayoutSpec(stripe_count=-1), LayoutSpec(chunk_size=1 << 40)):
        with pytest.raises(ValueError):
            client.pipe(f"{ns}/bad.bin", b"x", layout=spec)
        with pytest.raises(InvalidLayout):
            client.mkdir(f"{ns}/bad-dir", layout=spec)
    assert not client.exists(f"{ns}/bad.bin")


def test_stat_json_shows_size_and_layout(client: Client, cluster: ThreadCluster, ns: str,
                                         payload) -> None:
    info = client.pipe(f"{ns}/j.bin", payload(SMALL * 3),
                       layout=LayoutSpec(chunk_size=SMALL, stripe_count=2, replicas=2))
    out = subprocess.run([sys.executable, "-m", "stager", "--meta", cluster.meta_url, "stat",
                          "--json", f"{ns}/j.bin"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["size"] == SMALL * 3
    assert body["type"] == "file"
    assert info.layout is not None
    assert body["layout"]["chunk_size"] == SMALL
    assert body["layout"]["stripe_count"] == 2
    assert body["layout"]["replicas"] == 2
    assert body["layout"]["targets"] == list(info.layout.targets)
    assert set(body["layout"]["targets"]) <= {cluster.target_id(i) for i in range(cluster.n)}


# -- the pure placement and striping functions ------------------------------------------------
def targets(spec: dict[str, int]) -> list[TargetInfo]:
    """Targets named NODE-tK for ``{node: count}``."""
    return [TargetInfo(id=f"{node}-t{k}", node=node, url=f"http://{node}:{k}")
            for node, count in spec.items() for k in range(count)]


def test_spread_placement_interleaves_nodes() -> None:
    ts = targets({"a": 2, "b": 2, "c": 2})
    for start in range(12):
        lay = choose_layout(ts, chunk_size=SMALL, stripe_count=0, replicas=1,
                            max_stripe_count=8, start=start)
        assert lay.stripe_count == 6 and len(set(lay.targets)) == 6
        # neighbouring slots never share a node
        for k in range(6):
            assert lay.nodes[k] != lay.nodes[(k + 1) % 6]
    starts = {choose_layout(ts, chunk_size=SMALL, stripe_count=2, replicas=1,
                            max_stripe_count=8, start=s).targets[0] for s in range(12)}
    assert len(starts) > 1, "files should not all begin on the same target"


def test_placement_skips_down_targets_and_caps_stripe_count() -> None:
    ts = targets({"a": 3, "b": 3, "c": 3, "d": 3})
    ts[0] = TargetInfo(id=ts[0].id, node="a", url="http://x", state="down")
    lay = choose_layout(ts, chunk_size=SMALL, stripe_count=0, replicas=1,
                        max_stripe_count=8, start=0)
    assert lay.stripe_count == 8 and ts[0].id not in lay.targets
    with pytest.raises(NoTargets):
        choose_layout(ts, chunk_size=SMALL, stripe_count=12, replicas=1,
                      max_stripe_count=8, start=0)
    with pytest.raises(NoTargets):
        choose_layout([], chunk_size=SMALL, stripe_count=0, replicas=1,
                      max_stripe_count=8, start=0)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_replica_slots_are_on_distinct_nodes(replicas: int) -> None:
    ts = targets({"a": 3, "b": 2, "c": 1})
    lay = choose_layout(ts, chunk_size=SMALL, stripe_count=6, replicas=replicas,
                        max_stripe_count=8, start=3)
    for index in range(20):
        slots = chunk_slots(lay, index)
        assert slots[0] == index % lay.stripe_count
        assert len(slots) == replicas
        assert len({lay.nodes[s] for s in slots}) == replicas
        assert chunk_targets(lay, index) == [lay.targets[s] for s in slots]


def test_too_many_replicas_for_the_nodes() -> None:
    with pytest.raises(NoTargets):
        choose_layout(targets({"a": 4, "b": 1}), chunk_size=SMALL, stripe_count=0,
                      replicas=3, max_stripe_count=8, start=0)


def test_pieces_cover_a_range_exactly() -> None:
    size = SMALL * 3 + 100
    for start, stop in [(0, size), (1, SMALL), (SMALL - 1, SMALL + 1), (5, 5),
                        (size - 1, size + 50), (SMALL * 3, size)]:
        ps = list(pieces(SMALL, size, start, stop))
        assert sum(p.length for p in ps) == max(0, min(stop, size) - start)
        pos = start
        for p in ps:
            assert p.file_offset == pos == p.index * SMALL + p.offset
            assert 0 < p.length <= SMALL - p.offset
            pos += p.length
    assert [chunk_length(SMALL, size, i) for i in range(5)] == [SMALL, SMALL, SMALL, 100, 0]


def test_layout_json_round_trip_and_validation() -> None:
    lay = Layout(chunk_size=SMALL, stripe_count=2, replicas=1, targets=("t1", "t2"),
                 nodes=("n1", "n2"))
    assert Layout.from_json(lay.to_json()) == lay
    bad = dict(lay.to_json(), stripe_count=3)
    with pytest.raises(InvalidLayout):
        Layout.from_json(bad)
    with pytest.raises(ValueError):
        Layout.from_json(dict(lay.to_json(), chunk_size="big"))
    with pytest.raises(InvalidLayout):
        LayoutSpec.from_json({"chunk_size": SMALL, "colour": "red"})
    assert LayoutSpec(replicas=2).merged_over(LayoutSpec(SMALL, 3, 1)) == \
        LayoutSpec(SMALL, 3, 2)


def test_every_policy_kind_is_listed_in_one_place() -> None:
    import stager.eviction  # noqa: F401 - registers the eviction policies
    import stager.loader  # noqa: F401 - registers the loader's policies
    import stager.meta.upkeep.replan  # noqa: F401
    from stager.policies import REGISTRIES

    assert {"placement", "replacement", "order", "partition", "worker split",
            "eviction"} <= set(REGISTRIES)
    assert "spread" in REGISTRIES["placement"]
    with pytest.raises(ValueError, match="unknown placement policy 'nope'"):
        REGISTRIES["placement"]["nope"]
