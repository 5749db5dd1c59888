"""The multi-node harness: namespaces joined by capped links, always torn down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stager import AsyncClient
from stager.config import load_config
from stager.protocol.models import LayoutSpec
from stager.testing.netns import NetnsFabric, list_links, list_netns, netns_unavailable, sweep_stale
from stager.testing.nodes import NodeCluster

WHY = netns_unavailable()
needs_netns = pytest.mark.skipif(WHY is not None, reason=f"multi-node harness: {WHY}")
REPO = Path(__file__).resolve().parent.parent


def _ours(pid: int) -> list[str]:
    """Namespaces and links that process ``pid`` made."""
    return [n for n in list_netns() if n.startswith(f"stager-{pid}-")] + \
        [n for n in list_links() if n.startswith((f"sb{pid:x}-", f"sv{pid:x}-"))]


@needs_netns
async def test_file_striped_over_two_namespaces_reads_back_exact(tmp_path: Path) -> None:
    data = os.urandom(5 * (1 << 20) + 12345)
    cluster = NodeCluster(tmp_path, 2, rate_mbit=400, mode="netns")
    cluster.start()
    try:
        assert cluster.mode == "netns"
        addresses = {cluster.address(0), cluster.address(1)}
        assert len(addresses) == 2 and all(a.startswith("10.77.") for a in addresses)
        async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
            await c.pipe("/striped.bin", data,
                         layout=LayoutSpec(chunk_size=1 << 20, stripe_count=2))
            info = await c.stat("/striped.bin")
            assert info.layout is not None and info.layout.stripe_count == 2
            # Each chunk lives inside a namespace, at that node's own address.
            assert {u.split("//")[1].split(":")[0] for u in info.locations.values()} \
                == addresses
            assert await c.cat("/striped.bin") == data
            assert await c.cat("/striped.bin", 1 << 20, 3 * (1 << 20) + 7) == \
                data[1 << 20:3 * (1 << 20) + 7]
        assert len(_ours(os.getpid())) == 2 + 1 + 2   # namespaces, bridge, veths
    finally:
        cluster.stop()
    assert _ours(os.getpid()) == []


@needs_netns
def test_fabric_caps_links_and_removes_everything_after_a_failure() -> None:
    fabric = NetnsFabric(2, rate_mbit=100)
    with pytest.raises(RuntimeError, match="boom"), fabric:
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", fabric.nodes[0].host_if],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        inside = subprocess.run(fabric.netns_argv(1, ["tc", "qdisc", "show", "dev", "eth0"]),
                                capture_output=True, text=True, check=True).stdout
        assert "tbf" in inside
        fabric.set_rate(None)
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", fabric.nodes[0].host_if],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" not in qdisc
        raise RuntimeError("boom")
    assert fabric.leftovers() == []


HOLDER = textwrap.dedent("""
    import sys, time
    from stager.testing.netns import NetnsFabric
    fabric = NetnsFabric(2, rate_mbit=50)
    fabric.up()
    print("up", flush=True)
    try:
        time.sleep(60)
    finally:
        fabric.down()
""")


def _holder() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    assert len(_ours(proc.pid)) == 5
    return proc


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_the_fabric_down(sig: int) -> None:
    proc = _holder()
    proc.send_signal(sig)
    proc.communicate(timeout=20)
    assert proc.returncode != 0 and _ours(proc.pid) == []


@needs_netns
def test_what_a_killed_process_left_is_swept() -> None:
    proc = _holder()
    proc.kill()                        # SIGKILL: no handler runs
    proc.communicate(timeout=20)
    assert len(_ours(proc.pid)) == 5
    removed = sweep_stale()
    assert set(_ours(proc.pid)) == set() and len(removed) >= 5


def test_loopback_mode_runs_the_same_servers(tmp_path: Path) -> None:
    with NodeCluster(tmp_path, 2, mode="loopback") as cluster:
        assert cluster.mode == "loopback" and not cluster.capped
        assert all(u.startswith("http://127.0.0.1:") for u in cluster.data_urls)
        from stager import Client

        with Client(cluster.meta_url, config=load_config(env={})) as c:
            c.pipe("/x", b"hello" * 1000)
            assert c.cat("/x") == b"hello" * 1000
    time.sleep(0)  # the servers are gone: nothing to assert beyond stop() returning
