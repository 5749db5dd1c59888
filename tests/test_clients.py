"""The runnable example clients in clients/ work against a real cluster (so they never rot)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stager import Client
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # the example clients as processes: not in make check

CLIENTS = Path(__file__).resolve().parent.parent / "clients"
DEAD = "http://127.0.0.1:9"     # the discard port: nothing listens there


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})})


needs_curl = pytest.mark.skipif(shutil.which("curl") is None,
                                reason="curl is not installed; clients/http_curl.sh needs it")


@needs_curl
def test_http_curl_script(cluster: ThreadCluster, client: Client) -> None:
    out = run(["bash", str(CLIENTS / "http_curl.sh")], env={"STAGER_META_URL": cluster.meta_url})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith(f"at {cluster.meta_url}")
    assert [line[:2] for line in out.stdout.splitlines()[:6]] == ["1.", "2.", "3.", "4.", "5.",
                                                                 "6."]
    assert not [e for e in client.ls("/examples") if e.name.startswith("curl-")]


@needs_curl
def test_http_curl_script_takes_the_url_as_argument_and_fails_loudly(
        cluster: ThreadCluster) -> None:
    out = run(["bash", str(CLIENTS / "http_curl.sh"), cluster.meta_url + "/"],
              env={"STAGER_META_URL": DEAD})
    assert out.returncode == 0, out.stderr
    dead = run(["bash", str(CLIENTS / "http_curl.sh"), DEAD])
    assert dead.returncode != 0
    assert "ok:" not in dead.stdout


def test_python_basic_client(cluster: ThreadCluster) -> None:
    out = run([sys.executable, str(CLIENTS / "python_basic.py"), cluster.meta_url])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:7]] == ["put", "ls", "stat", "cat", "get", "rm"]
    assert "identical" in out.stdout and lines[-1] == "ok"


def test_python_basic_client_from_the_environment(cluster: ThreadCluster) -> None:
    out = run([sys.executable, str(CLIENTS / "python_basic.py")],
              env={"STAGER_META_URL": cluster.meta_url})
    assert out.returncode == 0, out.stdout + out.stderr
    dead = run([sys.executable, str(CLIENTS / "python_basic.py"), DEAD])
    assert dead.returncode != 0 and "ok" not in dead.stdout.splitlines()
    assert dead.stderr.startswith("python_basic.py: error: ") and "unreachable" in dead.stderr
    assert "Traceback" not in dead.stderr
