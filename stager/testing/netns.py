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

Teardown is bounded, so that a loaded machine cannot turn it into a hang: the
processes inside the namespaces are found through ``/proc`` and SIGKILLed, then
every link and namespace goes in one ``ip -force -batch`` run, killed if it
outlives :data:`TEARDOWN_DEADLINE` (what it could not remove, :func:`sweep_stale`
removes once this process has gone).  A second signal during teardown waits for
it to end instead of cutting it short.  Setup batches its commands too: one
``ip``/``tc`` run for the root namespace, one per node, not one per command.

Needs root and iproute2 (``ip``, ``tc``); :func:`netns_unavailable` says why not.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
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
from typing import Any

from ..deploy.jobprocs import pid_alive
from .locks import exclusive

log = logging.getLogger("stager.testing")

LOCK_FILE = Path("/tmp/stager-netns.lock")
NS_RE = re.compile(r"^stager-(\d+)-(\d+)-(\d+)$")
LINK_RE = re.compile(r"^s[bv]([0-9a-f]+)-")
_seq = 0
_live: set[NetnsFabric] = set()
_live_lock = threading.Lock()
_old_handlers: dict[int, object] = {}
TEARDOWN_DEADLINE = 10.0   # seconds one teardown may wait on `ip`, however loaded
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def _batch(tool: str, lines: list[str], *, netns: str | None = None, check: bool = True,
           timeout: float = 30.0) -> None:
    """Run ``lines`` through one ``ip``/``tc`` process (inside ``netns`` if given).

    One fork and exec instead of one per command: that is what grows under load.
    ``check=False`` goes on past failing lines (``-force``): a link already gone."""
    argv = [tool, *(("-netns", netns) if netns else ()), *(() if check else ("-force",)),
            "-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")


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
            with exclusive(LOCK_FILE):   # subnet choice, between fabrics being built
                third = _free_subnet(self.pid + self.seq)
                self.subnet = f"10.77.{third}.0/24"
                self.host_address = f"10.77.{third}.1"
                _batch("ip", [f"link add {self.bridge} type bridge",
                              f"addr add {self.host_address}/24 dev {self.bridge}",
                              f"link set {self.bridge} up"])
                _forward(self.bridge, "-I")
            nodes = [Node(i, f"node{i}", self._netns(i), f"10.77.{third}.{10 + i}",
                          self._host_if(i)) for i in range(self._n)]
            _batch("ip", [f"netns add {n.netns}" for n in nodes]
                   + [f"link add {n.host_if} type veth peer name eth0 netns {n.netns}"
                      for n in nodes]
                   + [f"link set {n.host_if} master {self.bridge} up" for n in nodes])
            for n in nodes:
                _batch("ip", [f"addr add {n.address}/24 dev eth0", "link set eth0 up",
                              "link set lo up"], netns=n.netns)
            self.nodes = nodes
            self.set_rate(self.rate_mbit)
        except BaseException:
            self.down()
            raise

    def _netns(self, i: int) -> str:
        return f"stager-{self.pid}-{self.seq}-{i}"

    def _host_if(self, i: int) -> str:
        return f"sv{self._tag}-{i:x}"

    def set_rate(self, rate_mbit: float | None) -> None:
        """Cap every link in both directions at ``rate_mbit`` (``None``: uncapped)."""
        self.rate_mbit = rate_mbit
        if rate_mbit is None:   # a link may have no qdisc left to delete: not an error
            line, check = "qdisc del dev {} root", False
        else:
            line, check = " ".join(["qdisc replace dev {} root", *tbf_args(rate_mbit)]), True
        if self.nodes:
            _batch("tc", [line.format(n.host_if) for n in self.nodes], check=check)
        for n in self.nodes:
            _batch("tc", [line.format("eth0")], netns=n.netns, check=check)

    def netns_argv(self, index: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``index``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[index].netns, *argv]

    # -- teardown --------------------------------------------------------------------
    def down(self) -> None:
        """Kill what runs in the namespaces, delete them and the bridge.  Idempotent,
        and bounded by :data:`TEARDOWN_DEADLINE` whatever the machine's load."""
        if not self._up:
            return
        self._up = False
        try:
            with _signals_deferred():
                names = [self._netns(i) for i in range(self._n)]
                _kill_inside(names)
                links = [self._host_if(i) for i in range(self._n)] + [self.bridge]
                _forward(self.bridge, "-D")
                if not _remove(links, names):
                    log.warning("fabric %s: teardown ran past %.0f s; what is left goes "
                                "with sweep_stale() once process %d has exited",
                                self.bridge, TEARDOWN_DEADLINE, self.pid)
        finally:
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


def _kill_inside(namespaces: list[str]) -> None:
    """SIGKILL every process inside ``namespaces`` (only ever ours).

    Found as ``ip netns pids`` finds them, by the namespace's inode, but through
    ``/proc`` in this process: no ``ip`` run per namespace."""
    wanted = set()
    for ns in namespaces:
        try:
            st = os.stat(f"/run/netns/{ns}")
        except OSError:
            continue
        wanted.add((st.st_dev, st.st_ino))
    if not wanted:
        return
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
            if (st.st_dev, st.st_ino) in wanted:
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass   # gone meanwhile


def _remove(links: list[str], namespaces: list[str]) -> bool:
    """Delete ``links`` then ``namespaces`` in one ``ip`` run; ``False`` when it ran
    past :data:`TEARDOWN_DEADLINE` and was killed.

    Deleting a veth's host end removes the pair at once; a namespace's own links go
    asynchronously after ``ip netns del``, which would leave them visible a while."""
    lines = [f"link del {name}" for name in links] + [f"netns del {ns}" for ns in namespaces]
    if not lines:
        return True
    try:
        _batch("ip", lines, check=False, timeout=TEARDOWN_DEADLINE)
    except subprocess.TimeoutExpired:
        return False
    return True


def _bridge_filtered() -> bool:
    """Do bridged packets cross iptables (``br_netfilter`` loaded, as Docker does)?
    Then its FORWARD policy, DROP under Docker, applies between two nodes too."""
    try:
        return Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
    except OSError:
        return False


def _forward(bridge: str, op: str) -> None:
    """``op`` ``-I`` (insert) or ``-D`` (delete) the rule that lets node-to-node packets
    across ``bridge`` through a filtering FORWARD chain; nothing where none filters."""
    if not _bridge_filtered() or shutil.which("iptables") is None:
        return
    _run("iptables", "-w", "10", op, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
         check=op == "-I")


def _stale_forward_rules() -> None:
    """Delete the FORWARD rules of bridges whose process is gone (see :func:`_forward`)."""
    if not _bridge_filtered() or shutil.which("iptables") is None:
        return
    for line in _run("iptables", "-w", "10", "-S", "FORWARD", check=False).splitlines():
        words = line.split()
        if words[:1] == ["-A"] and "-i" in words:
            bridge = words[words.index("-i") + 1]
            if (m := LINK_RE.match(bridge)) and bridge.startswith("sb") \
                    and not pid_alive(int(m.group(1), 16)):
                _forward(bridge, "-D")


def sweep_stale() -> list[str]:
    """Remove namespaces and links left by stager processes that no longer run."""
    _stale_forward_rules()
    links = [link for link in list_links()
             if (m := LINK_RE.match(link)) and not pid_alive(int(m.group(1), 16))]
    spaces = [ns for ns in list_netns()
              if (m := NS_RE.match(ns)) and not pid_alive(int(m.group(1)))]
    _kill_inside(spaces)
    _remove(links, spaces)
    return links + spaces


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


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then raise the first.

    A second Ctrl-C during teardown would otherwise cut it short and leave the
    namespaces behind; the wait is bounded, since teardown is.  Python handlers are
    swapped rather than the signal mask, which another thread could escape."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    saved: dict[signal.Signals, Any] = {}
    for sig in TEARDOWN_SIGNALS:
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            saved[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
        if held:
            signal.raise_signal(held[0])


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Unwind through every `finally` and `__exit__`, which tear the fabrics down.
    raise SystemExit(128 + signum)


@atexit.register
def _down_all() -> None:
    for fabric in list(_live):
        fabric.down()
