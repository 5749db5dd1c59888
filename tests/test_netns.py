"""The multi-node harness: namespaces joined by capped links, always torn down."""

from __future__ import annotations

import os
import selectors
import shutil
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
from stager.testing.locks import NODES_LOCK
from stager.testing.netns import (
    TEARDOWN_DEADLINE,
    NetnsFabric,
    list_links,
    list_netns,
    netns_unavailable,
    sweep_stale,
)
from stager.testing.nodes import KILL_WAIT, STOP_GRACE, NodeCluster

pytestmark = [pytest.mark.slow,     # network namespaces: not in make check
              pytest.mark.xdist_group("slurm")]   # one node-emulating module at a time

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
def test_this_module_runs_in_its_turn_of_the_nodes_lock() -> None:
    """The group's modules hold stager.testing.locks.NODES_LOCK while they run
    (tests/conftest.py), so a node benchmark of the quick run waits: another process
    cannot take the lock now."""
    probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"
             "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError: sys.exit(7)")
    done = subprocess.run([sys.executable, "-c", probe, str(NODES_LOCK)], timeout=60)
    assert done.returncode == 7, "the nodes lock was free while this module ran"


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


# A shell's background job (`make test &`, some CI runners) starts with SIGINT
# ignored, and Python keeps it so: the holder asks for Ctrl-C's usual
# KeyboardInterrupt itself.  "up" is printed inside `try`, so a signal that comes
# at once still unwinds through `finally`.
HOLDER = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from stager.testing import netns
    fabric = netns.NetnsFabric(2, rate_mbit=50)
    fabric.up()
    try:
        if len(sys.argv) > 1:    # teardown's `ip` is the test's own from now on
            netns.TEARDOWN_DEADLINE = float(sys.argv[1])
            os.environ["PATH"] = sys.argv[2] + os.pathsep + os.environ["PATH"]
        print("up", flush=True)
        time.sleep(60)
    finally:
        fabric.down()
""")
STARTUP_TIMEOUT = 60.0   # python start and fabric setup, on a loaded machine
EXIT_TIMEOUT = TEARDOWN_DEADLINE + 10.0   # teardown's own bound, and a margin


def _holder(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(STARTUP_TIMEOUT):
            proc.kill()
            proc.communicate()
            pytest.fail(f"the holder did not set its fabric up in {STARTUP_TIMEOUT} s")
    assert proc.stdout.readline().strip() == "up"
    assert len(_ours(proc.pid)) == 5
    return proc


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_the_fabric_down(sig: int) -> None:
    proc = _holder()
    proc.send_signal(sig)
    proc.communicate(timeout=EXIT_TIMEOUT)
    assert proc.returncode != 0 and _ours(proc.pid) == []


def _fake_ip(folder: Path, script: str) -> str:
    (folder / "ip").write_text(f"#!/bin/sh\n{script}\n")
    (folder / "ip").chmod(0o755)
    return str(folder)


@needs_netns
def test_teardown_is_bounded_when_ip_hangs(tmp_path: Path) -> None:
    proc = _holder("1", _fake_ip(tmp_path, "exec sleep 600"))
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=EXIT_TIMEOUT)
    assert proc.returncode != 0 and time.monotonic() - start < EXIT_TIMEOUT
    assert len(_ours(proc.pid)) == 5     # `ip` never ran: all of it is still there
    sweep_stale()                        # ...until the next run sweeps it
    assert _ours(proc.pid) == []


@needs_netns
def test_a_second_signal_waits_for_teardown_to_end(tmp_path: Path) -> None:
    # Teardown's `ip` sends the holder SIGTERM before doing its work: the holder
    # finishes removing everything, and only then exits as SIGTERM asks.
    real_ip = shutil.which("ip")
    proc = _holder(str(TEARDOWN_DEADLINE),
                   _fake_ip(tmp_path, f'kill -TERM $PPID\nexec {real_ip} "$@"'))
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=EXIT_TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM and _ours(proc.pid) == []


@needs_netns
def test_what_a_killed_process_left_is_swept() -> None:
    proc = _holder()
    proc.kill()                        # SIGKILL: no handler runs
    proc.communicate(timeout=EXIT_TIMEOUT)
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


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_stop_ends_whole_process_groups_in_bounded_time(tmp_path: Path) -> None:
    # A process that shrugs off SIGTERM and has a child of its own: stop() must not
    # wait for it past its grace, and must not leave the child running.
    cluster = NodeCluster(tmp_path, 1, mode="loopback")
    cluster.start()
    try:
        stubborn = cluster.popen_in(0, ["sh", "-c", "trap '' TERM; sleep 600 & echo $!; wait"],
                                    stdout=subprocess.PIPE)
        assert stubborn.stdout is not None
        child = int(stubborn.stdout.readline())
    finally:
        start = time.monotonic()
        cluster.stop()
    assert time.monotonic() - start < STOP_GRACE + KILL_WAIT + TEARDOWN_DEADLINE
    stubborn.stdout.close()
    assert stubborn.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)
