"""deploy/systemd: the units verify, and their command lines run a working cluster.

``systemd-analyze verify`` checks the units (with the installed paths pointed at
this checkout).  Then each unit's ``ExecStartPre``/``ExecStart``/``ExecStartPost``
runs as systemd would run it, with ``/etc/stager``, ``/var/lib/stager``,
``/srv/stager`` and ``/run/stager`` moved under a temporary directory: the
metadata server (with tokens) and two data-disk instances (joining with the
join token) start from deploy/README.md's ``stager.toml``, the
readiness check passes only once each answers ``/v1/health``, and both disks
register.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stager.testing.cluster import wait_for_targets

pytestmark = pytest.mark.slow      # the units' processes: not in make check

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "deploy" / "systemd"
WAIT_READY = UNITS / "stager-wait-ready"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values…]}}``; a key may repeat (ExecStartPre, Environment)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"not a unit line: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    return parse_unit((UNITS / name).read_text())


@pytest.mark.parametrize("name", ["stager-meta.service", "stager-data@.service"])
def test_units_restart_on_failure_and_wait_for_health(name: str) -> None:
    service = unit(name)["Service"]
    assert service["Restart"] == ["on-failure"]
    assert service["Environment"] == ["STAGER_CONFIG=/etc/stager/stager.toml"]
    assert service["ExecStartPost"][0].startswith("/usr/local/libexec/stager-wait-ready ")
    assert "WantedBy" in unit(name)["Install"]


def _installed(tmp: Path) -> tuple[dict[str, str], Path]:
    """Path substitutions into ``tmp`` and a ``stager`` executable for this checkout."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True)
    stager = bin_dir / "stager"
    stager.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} "
                      f"exec {shlex.quote(sys.executable)} -m stager \"$@\"\n")
    stager.chmod(0o755)
    paths = {"/usr/local/bin/stager": str(stager),
             "/usr/local/libexec/stager-wait-ready": str(WAIT_READY)}
    for d in ("/etc/stager", "/var/lib/stager", "/srv/stager", "/run/stager"):
        paths[d] = str(tmp / d.strip("/").replace("/", "-"))
        Path(paths[d]).mkdir(parents=True, exist_ok=True)
    return paths, stager


def _moved(text: str, paths: dict[str, str]) -> str:
    for old, new in paths.items():
        text = text.replace(old, new)
    return text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    paths, _ = _installed(tmp_path)
    names = []
    for name, as_name in (("stager-meta.service", "stager-meta.service"),
                          ("stager-data@.service", "stager-data@nvme0.service")):
        (tmp_path / as_name).write_text(_moved((UNITS / name).read_text(), paths))
        names.append(str(tmp_path / as_name))
    out = subprocess.run(["systemd-analyze", "verify", *names], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def _commands(name: str, instance: str, paths: dict[str, str]) -> dict[str, list[list[str]]]:
    service = unit(name)["Service"]
    return {key: [shlex.split(_moved(line.replace("%i", instance), paths))
                  for line in service.get(key, [])]
            for key in ("ExecStartPre", "ExecStart", "ExecStartPost")}


def _start(name: str, instance: str, paths: dict[str, str], env: dict[str, str],
           procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    """What systemd does for one unit: pre, start (in the background), post must pass."""
    cmds = _commands(name, instance, paths)
    for argv in cmds["ExecStartPre"]:
        subprocess.run(argv, env=env, check=True, timeout=30)
    (argv,) = cmds["ExecStart"]
    with open(log, "ab") as out:
        procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
    for argv in cmds["ExecStartPost"]:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, f"{argv}: {done.stderr}\n{log.read_text()[-2000:]}"


def test_the_units_command_lines_start_a_cluster(tmp_path: Path) -> None:
    paths, stager = _installed(tmp_path)
    config = Path(paths["/etc/stager"]) / "stager.toml"
    join = Path(paths["/etc/stager"]) / "join.token"
    # deploy/README.md's stager.toml, on loopback
    config.write_text(f'host = "127.0.0.1"\nmeta_url = "http://127.0.0.1:17070"\n'
                      f'auth = true\nreplicas = 2\ntoken_file = "{join}"\n'
                      'heartbeat_interval = 0.5\n')
    # the unit's port 7070 may be taken on a test machine: 17070, the config's too
    paths["--port 7070"] = "--port 17070"
    env = {**os.environ, "STAGER_CONFIG": str(config)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # a readiness check against a server that is not there fails, it does not hang
        missing = subprocess.run([str(WAIT_READY), str(tmp_path / "none.json"), "1"],
                                 capture_output=True, text=True, timeout=30)
        assert missing.returncode == 1 and "no healthy server" in missing.stderr
        _start("stager-meta.service", "", paths, env, procs, tmp_path / "meta.log")
        # the README's join token, minted with the admin token the metadata server wrote
        admin = Path(paths["/var/lib/stager"]) / "meta" / "admin.token"
        minted = subprocess.run([str(stager), "--token-file", str(admin), "token", "create",
                                 "--scope", "join", "--name", "storage-nodes"],
                                env={**env, "STAGER_META_URL": "http://127.0.0.1:17070"},
                                capture_output=True, text=True, timeout=60, check=True)
        join.write_text(minted.stdout.strip().splitlines()[-1] + "\n")
        for disk in ("nvme0", "nvme1"):
            Path(paths["/srv/stager"], disk).mkdir()
            _start("stager-data@.service", disk, paths, env, procs, tmp_path / f"{disk}.log")
        wait_for_targets("http://127.0.0.1:17070", 2, 30, exact=True,
                         token=admin.read_text().strip())
        assert (Path(paths["/srv/stager"]) / "nvme1" / "stager" / "target.json").exists()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
