"""The client's I/O thread: uvloop by default, asyncio on request, one per process,
shared by Client, Loader and stager://, and a fresh one in a forked child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # forked processes: not in make check

# Run in a fresh interpreter: the first caller in a process chooses the loop's kind.
KIND = r"""
import json, sys, threading
import fsspec
from stager import Client, Loader
from stager.config import Config
meta, kind, source = sys.argv[1:4]
config = Config(meta_url=meta, event_loop=kind) if kind != "env" else None
with Client(meta, config=config) as c:
    c.pipe(source + "/a.bin", b"x" * 5000)
    c.pipe(source + "/b.bin", b"y" * 7000)
    fs = fsspec.filesystem("stager", meta_url=meta, config=config, skip_instance_cache=True)
    with Loader(source, meta_url=meta, config=config, batch_size=1, shuffle=False,
                format="files") as loader:
        sizes = sorted(len(b[0]["data"]) for b in loader)
        same = loader._client.loop is c.loop is fs.loop
    print(json.dumps({"loop": type(c.loop).__module__ + "." + type(c.loop).__name__,
                      "same": same, "sizes": sizes, "cat": len(fs.cat(source + "/a.bin")),
                      "threads": sorted(t.name for t in threading.enumerate()
                                        if t.name == "stager-io")}))
"""


def run_kind(cluster: ThreadCluster, kind: str, source: str,
             env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", KIND, cluster.meta_url, kind, source],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(("kind", "module"), [("auto", "uvloop"), ("uvloop", "uvloop"),
                                              ("asyncio", "asyncio.unix_events")])
def test_the_loop_kind_follows_the_config(cluster: ThreadCluster, ns: str, kind: str,
                                          module: str) -> None:
    pytest.importorskip("uvloop")
    got = run_kind(cluster, kind, ns)
    assert got["loop"].startswith(module + "."), got
    # Client, Loader and the filesystem share it, and it does the work
    assert got["same"] is True
    assert got["sizes"] == [5000, 7000] and got["cat"] == 5000
    assert got["threads"] == ["stager-io"]


def test_the_environment_chooses_asyncio(cluster: ThreadCluster, ns: str) -> None:
    env = dict(os.environ, STAGER_EVENT_LOOP="asyncio", STAGER_META_URL=cluster.meta_url)
    got = run_kind(cluster, "env", ns, env=env)
    assert got["loop"] == "asyncio.unix_events._UnixSelectorEventLoop", got
    assert got["sizes"] == [5000, 7000]


FORK = r"""
import json, os, sys
from stager import Client
from stager.client import holder
meta, path = sys.argv[1:3]
c = Client(meta)
c.pipe(path, b"z" * 3000)
parent = c.loop
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        cat = len(c.cat(path))
        child = c.loop
        out = {"new": child is not parent, "running": child.is_running(),
               "kept": holder.current().parent.loop is parent, "cat": cat}
    except BaseException as exc:
        out = {"error": repr(exc)}
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 65536))
print(json.dumps({"child": child, "status": status, "parent_cat": len(c.cat(path)),
                  "parent_same": c.loop is parent}))
c.close()
"""


def test_a_forked_child_starts_its_own_loop(cluster: ThreadCluster, ns: str) -> None:
    out = subprocess.run([sys.executable, "-c", FORK, cluster.meta_url, f"{ns}/f.bin"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["status"] == 0
    # the child's loop is new and works; the parent's is kept, untouched, and still works
    assert got["child"] == {"new": True, "running": True, "kept": True, "cat": 3000}, got
    assert got["parent_cat"] == 3000 and got["parent_same"] is True


# A plain fork whose child exits normally: atexit, finalizers and teardown all run there.
FORK_EXIT = r"""
import os, sys
import fsspec
from stager import Client
meta, path = sys.argv[1:3]
c = Client(meta)
c.pipe(path, b"q" * 2000)
fs = fsspec.filesystem("stager", meta_url=meta, skip_instance_cache=True)
assert fs.cat(path) == b"q" * 2000
pid = os.fork()
if pid == 0:
    assert c.cat(path) == fs.cat(path) == b"q" * 2000
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert status == 0, status
assert c.cat(path) == fs.cat(path) == b"q" * 2000
print("ok")
"""


def test_a_forked_child_closes_its_own_and_leaves_the_parents(cluster: ThreadCluster,
                                                              ns: str) -> None:
    """The child closes the sessions it made and neither closes nor collects the
    parent's copies: nothing warns, in either process, and the parent reads on."""
    out = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", FORK_EXIT,
                          cluster.meta_url, f"{ns}/e.bin"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok"]
    assert "Unclosed" not in out.stderr, out.stderr
    assert out.stderr == ""


# A pass left half read: its iterator is collected only as the interpreter finalizes.
MID_PASS = r"""
import sys
from stager import Client, Loader
meta, source = sys.argv[1:3]
with Client(meta) as c:
    for i in range(40):
        c.pipe(f"{source}/s{i:02d}.bin", bytes([i]) * 5000)
loader = Loader(source, meta_url=meta, batch_size=2, format="files", prefetch_batches=8)
batches = iter(loader)
print(len(next(batches)))
"""


def test_the_process_exits_with_a_pass_left_half_read(cluster: ThreadCluster, ns: str) -> None:
    """At exit the holder stops the I/O loop it started: a prefetch stopped later, by an
    iterator collected as the interpreter finalizes, ends instead of waiting forever on
    a loop whose thread is frozen; nothing is left unclosed."""
    out = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", MID_PASS,
                          cluster.meta_url, ns],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2"]
    assert out.stderr == ""
