"""clients/train_loop.py, the Loader's example, runs against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stager import Client
from stager.testing import ThreadCluster

SCRIPT = Path(__file__).resolve().parent.parent / "clients" / "train_loop.py"


def test_train_loop_example(cluster: ThreadCluster, client: Client) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAGER_")}
    out = subprocess.run([sys.executable, str(SCRIPT), cluster.meta_url], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "ok"
    checkpoint = json.loads(lines[2].split(": ", 1)[1])
    assert checkpoint["epoch"] == 1 and checkpoint["cursor"] == 8192
    stats = json.loads(lines[-2].split(": ", 1)[1])
    assert stats["batches"] == 96 and stats["samples"] > 0 and stats["targets"]
    accuracy = float(lines[3].split("accuracy ")[1].split(",")[0])
    assert accuracy > 0.9
    assert not [e for e in client.ls("/examples") if e.name.startswith("train-")]
