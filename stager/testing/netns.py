"""Emulated storage nodes on one machine: network namespaces, a bridge, capped links.

Each node is a Linux network namespace joined to a bridge in the root namespace
by a veth pair.  ``tc tbf`` caps the egress of both ends of every pair, so a
node sends and receives at most ``rate_mbit`` megabit/s, like a node's NIC
scaled down.  The root namespace holds the bridge's address (``10.77.S.1``),
node *i* has ``10.77.S.(10+i)``; ``S`` is picked so that no address already on
this machine is reused.  These private addresses exist only inside the
namespaces the fabric itself creates.

Names carry the creating process's id (``stager-<pid>-<seq>-<i>`` for
namespaces, ``sb<pidhex>-<seq>`` for the bridge, ``sv<pidhex>-<seq>-<i>`` for
veths), so :func:`sweep_stale` can remove what a killed run left behind without
touching anything of a live process.  A fabric is always torn down: by its
context manager, by ``atexit``, and on SIGTERM/SIGHUP (turned into
``SystemExit`` so ``finally`` blocks run); Ctrl-C raises ``KeyboardInterrupt``
and unwinds the same way.

Needs root and iproute2 (``ip``, ``tc``); :func:`netns_unavailable` says why not.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

LOCK_FILE = Path("/tmp/stager-netns.lock")
NS_RE = re.compile(r"^stager-(\d+)-(\d+)-(\d+)$")
LINK_RE = re.compile(r"^s[bv]([0-9a-f]+)-")
_seq = 0
_live: set[NetnsFabric] = set()
_live_lock = threading.Lock()
_old_handlers: dict[int, object] = {}


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up."""


def netns_unavailable() -> str | None:
    """Why the fabric cannot run here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install iproute2"
    try:
        _ip("netns", "list")
    except NetnsError as exc:
        return f"`ip netns` does not work here: {exc}"
    return None


def _run(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _ip(*args: str, check: bool = True) -> str:
    return _run("ip", *args, check=check)


@dataclass(frozen=True)
class Node:
    index: int
    name: str          # the stager node name, "node<i>"
    netns: str         # the network namespace
    address: str       # the node's own address inside its namespace
    host_if: str       # the veth end on the bridge (root namespace)


class NetnsFabric:
    """The namespaces, the bridge and the capped veth pairs; no servers."""

    def __init__(self, nodes: int, *, rate_mbit: float | None = 200.0) -> None:
        global _seq
        if not 1 <= nodes <= 200:
            raise ValueError("between 1 and 200 nodes")
        _seq += 1
        self.pid, self.seq = os.getpid(), _seq
        tag = f"{self.pid:x}-{self.seq % 256:x}"
        self.bridge = f"sb{tag}"
        self.rate_mbit = rate_mbit
        self.subnet = ""
        self.host_address = ""
        self.nodes: list[Node] = []
        self._n = nodes
        self._tag = tag
        self._up = False

    def __enter__(self) -> NetnsFabric:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- setup -----------------------------------------------------------------------
    def up(self) -> None:
        """Create everything; on any failure remove what was made, then raise."""
        reason = netns_unavailable()
        if reason:
            raise NetnsError(reason)
        sweep_stale()
        _register(self)
        self._up = True
        try:
            with _alloc_lock():
                third = _free_subnet(self.pid + self.seq)
                self.subnet = f"10.77.{third}.0/24"
                self.host_address = f"10.77.{third}.1"
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self._n):
                self.nodes.append(self._add_node(i, third))
            self.set_rate(self.rate_mbit)
        except BaseException:
            self.down()
            raise

    def _add_node(self, i: int, third: int) -> Node:
        ns = f"stager-{self.pid}-{self.seq}-{i}"
        host_if = f"sv{self._tag}-{i:x}"
        node = Node(i, f"node{i}", ns, f"10.77.{third}.{10 + i}", host_if)
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host_if, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return node

    def set_rate(self, rate_mbit: float | None) -> None:
        """Cap every link in both directions at ``rate_mbit`` (``None``: uncapped)."""
        self.rate_mbit = rate_mbit
        for node in self.nodes:
            for prefix, dev in ((), node.host_if), (("ip", "netns", "exec", node.netns), "eth0"):
                if rate_mbit is None:
                    _run(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    _run(*prefix, "tc", "qdisc", "replace", "dev", dev, "root",
                         *tbf_args(rate_mbit))

    def netns_argv(self, index: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``index``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[index].netns, *argv]

    # -- teardown --------------------------------------------------------------------
    def down(self) -> None:
        """Kill what runs in the namespaces, delete them and the bridge.  Idempotent."""
        if not self._up:
            return
        self._up = False
        for i in range(self._n):
            # Deleting the host end removes the pair now; a namespace's own links go
            # asynchronously after `ip netns del`, which would leave them visible a while.
            _ip("link", "del", f"sv{self._tag}-{i:x}", check=False)
            _delete_netns(f"stager-{self.pid}-{self.seq}-{i}")
        _ip("link", "del", self.bridge, check=False)
        self.nodes = []
        _unregister(self)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this fabric that still exist (empty after ``down``)."""
        prefix = f"stager-{self.pid}-{self.seq}-"
        names = [n for n in list_netns() if n.startswith(prefix)]
        names += [n for n in list_links() if n == self.bridge
                  or n.startswith(f"sv{self._tag}-")]
        return names


def tbf_args(rate_mbit: float) -> list[str]:
    """A token bucket of ``rate_mbit``: a burst of 10 ms of traffic (at least a GSO
    packet, 64 KiB), and a queue of 50 ms before packets drop."""
    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]


def list_netns() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list", check=False).splitlines()
            if line.strip()]


def list_links() -> list[str]:
    out = []
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@")[0])
    return out


def _delete_netns(ns: str) -> None:
    """Kill every process inside ``ns`` (only ever ours), then delete it."""
    pids = _ip("netns", "pids", ns, check=False).split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", ns, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove namespaces and links left by stager processes that no longer run."""
    removed = []
    for link in list_links():   # host ends first: their peers go with them at once
        m = LINK_RE.match(link)
        if m and not _alive(int(m.group(1), 16)):
            _ip("link", "del", link, check=False)
            removed.append(link)
    for ns in list_netns():
        m = NS_RE.match(ns)
        if m and not _alive(int(m.group(1))):
            _delete_netns(ns)
            removed.append(ns)
    return removed


@contextmanager
def _alloc_lock() -> Iterator[None]:
    """Serialise subnet choice between processes building fabrics at the same time."""
    with open(LOCK_FILE, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_subnet(seed: int) -> int:
    """A third octet ``S`` such that nothing on this machine uses ``10.77.S.0/24``."""
    used = set()
    for line in _ip("-o", "-4", "addr", "show", check=False).splitlines():
        for word in line.split():
            if "/" in word:
                try:
                    net = ipaddress.ip_interface(word).network
                except ValueError:
                    continue
                used.add(net)
    for step in range(254):
        third = (seed + step) % 254 + 1
        candidate = ipaddress.ip_network(f"10.77.{third}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return third
    raise NetnsError("no free 10.77.x.0/24 subnet")


# -- always torn down ------------------------------------------------------------------
def _register(fabric: NetnsFabric) -> None:
    with _live_lock:
        first = not _live
        _live.add(fabric)
    if first and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                _old_handlers[sig] = signal.signal(sig, _on_signal)


def _unregister(fabric: NetnsFabric) -> None:
    with _live_lock:
        _live.discard(fabric)
        last = not _live
    if last and threading.current_thread() is threading.main_thread():
        for sig, old in list(_old_handlers.items()):
            signal.signal(sig, old)  # type: ignore[arg-type]
            del _old_handlers[sig]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Unwind through every `finally` and `__exit__`, which tear the fabrics down.
    raise SystemExit(128 + signum)


@atexit.register
def _down_all() -> None:
    for fabric in list(_live):
        fabric.down()
