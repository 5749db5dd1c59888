"""clients/fsspec_pandas.py runs against a real cluster (so the example never rots)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stager import Client
from stager.testing import ThreadCluster

EXAMPLE = Path(__file__).resolve().parent.parent / "clients" / "fsspec_pandas.py"


def test_fsspec_pandas_example(cluster: ThreadCluster, client: Client) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    out = subprocess.run([sys.executable, str(EXAMPLE), cluster.meta_url], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line[:2] for line in lines[:4]] == ["1.", "2.", "3.", "4."]
    assert "identical" in lines[1] and "crc32c:" in lines[3] and lines[-1] == "ok"
    assert not [e for e in client.ls("/examples") if e.name.startswith("pandas-")]
