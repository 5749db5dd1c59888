"""How long the multi-node harness takes to go away, idle and with CPU hogs.

A holder process (as ``tests/test_netns.py`` starts it) sets a fabric up, gets
SIGINT and tears it down: the figures are SIGINT-to-exit and ``down()`` alone.
A 3-node :class:`~stager.testing.nodes.NodeCluster` gives ``start()`` and
``stop()``.  Several source trees (each a folder holding ``stager/``, e.g. one
``git archive`` of the old commit and one of the new) are measured interleaved,
so that the machine's load, shared with others, falls on each alike:

    python -m bench.netns_teardown --reps 5 --hogs 0 2 -- OLD_TREE NEW_TREE

Needs root and iproute2, as the harness does.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time

HOLDER = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from stager.testing.netns import NetnsFabric
    fabric = NetnsFabric(int(sys.argv[1]), rate_mbit=50)
    fabric.up()
    try:
        print("up", flush=True)
        time.sleep(60)
    finally:
        t = time.monotonic()
        fabric.down()
        print(f"down {time.monotonic() - t:.3f}", file=sys.stderr, flush=True)
""")
CLUSTER = textwrap.dedent("""
    import tempfile, time
    from stager.testing.nodes import NodeCluster
    with tempfile.TemporaryDirectory() as tmp:
        c = NodeCluster(tmp, 3, rate_mbit=None, mode="netns")
        t0 = time.monotonic(); c.start(); up = time.monotonic() - t0
        t1 = time.monotonic(); c.stop(); print(up, time.monotonic() - t1)
""")
KINDS = {"holder 2 nodes": ("start->up", "SIGINT->exit", "down()"),
         "holder 8 nodes": ("start->up", "SIGINT->exit", "down()"),
         "NodeCluster 3": ("start()", "stop()")}


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree)}


def holder_once(tree: str, nodes: int) -> tuple[float, ...]:
    """Start to "up", SIGINT to exit, and ``down()`` as the holder timed it."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(nodes)], env=_env(tree),
                            cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "up":
        raise RuntimeError(f"holder failed: {proc.communicate(timeout=60)[1][-2000:]}")
    up = time.monotonic() - t0
    t1 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    gone = time.monotonic() - t1
    down = [line.split()[1] for line in err.splitlines() if line.startswith("down ")]
    return up, gone, float(down[0]) if down else float("nan")


def cluster_once(tree: str) -> tuple[float, ...]:
    out = subprocess.run([sys.executable, "-c", CLUSTER], env=_env(tree), cwd="/",
                         capture_output=True, text=True, check=True, timeout=180).stdout
    return tuple(float(x) for x in out.split())


def _hog() -> None:
    while True:
        pass


def measure(trees: list[str], reps: int) -> dict[tuple[str, str], list[tuple[float, ...]]]:
    rows: dict[tuple[str, str], list[tuple[float, ...]]] = {
        (t, k): [] for t in trees for k in KINDS}
    for _ in range(reps):
        for t in trees:
            rows[t, "holder 2 nodes"].append(holder_once(t, 2))
            rows[t, "holder 8 nodes"].append(holder_once(t, 8))
            rows[t, "NodeCluster 3"].append(cluster_once(t))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 2])
    ap.add_argument("trees", nargs="*", default=["."])
    args = ap.parse_args()
    for hogs in args.hogs:
        procs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
        for p in procs:
            p.start()
        try:
            rows = measure(args.trees, args.reps)
            load = os.getloadavg()[0]
        finally:
            for p in procs:
                p.kill()
                p.join()
        print(f"--- hogs={hogs} reps={args.reps} loadavg(1 min)={load:.1f}")
        for t in args.trees:
            for kind, names in KINDS.items():
                cols = list(zip(*rows[t, kind], strict=True))
                print(f"{t:>24} {kind:15} " + " | ".join(
                    f"{n} median {statistics.median(c):.3f} max {max(c):.3f}"
                    for n, c in zip(names, cols, strict=True)), flush=True)


if __name__ == "__main__":
    main()
