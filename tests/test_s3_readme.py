"""The README's S3 commands, run as written against a real ``stager up --s3-port``.

The console block under **S3** is read line by line (``$ `` lines, a trailing ``&``
dropped) and each command runs in a shell, in order, with the venv's ``stager`` and
``aws`` first on ``PATH``.  What is this test's own: the root ``/tmp/st`` is a
temporary directory, ``stager up`` gets ``--port 0`` and ``--s3-port 0`` (the
endpoint ``http://127.0.0.1:9000`` becomes the one ``cluster.json`` names), the
commands after it find the cluster through ``STAGER_META_URL``, and ``train.tar`` is
a file of random bytes in the working directory.  The last line's MD5 must be the
file's.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stager.testing.s3clients import machine_free_env

pytestmark = pytest.mark.slow      # stager up and the AWS CLI

REPO = Path(__file__).resolve().parent.parent
ROOT, ENDPOINT = "/tmp/st", "http://127.0.0.1:9000"
BIN = Path(sys.executable).parent


def s3_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("**S3**"):]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None, "README.md's S3 section has no console block"
    return re.findall(r"^\$ (.*)$", block.group(1), re.M)


def test_the_readme_shows_up_with_an_s3_port_then_a_client() -> None:
    first = shlex.split(s3_lines()[0], comments=True)
    assert first[:2] == ["stager", "up"] and "--s3-port" in first and first[-1] == "&"


def test_the_readme_s3_commands_run(tmp_path: Path) -> None:
    if not (BIN / "aws").exists():
        pytest.skip("needs the dev extra (awscli)")
    lines = s3_lines()
    up = shlex.split(lines[0], comments=True)[:-1]
    root = tmp_path / "st"
    argv = [root.as_posix() if a == ROOT else a for a in up]
    argv[argv.index("--s3-port") + 1] = "0"
    data = random.Random(7).randbytes(3 << 20)
    (tmp_path / "train.tar").write_bytes(data)
    env = machine_free_env({**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                            "PYTHONPATH": str(REPO)})     # this checkout's stager
    log = open(tmp_path / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", *argv, "--port", "0"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (root / "cluster.json").exists():
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "stager up did not start in time"
            time.sleep(0.05)
        cluster = json.loads((root / "cluster.json").read_text())
        env["STAGER_META_URL"] = cluster["meta"]["url"]
        out = ""
        for line in lines[1:]:
            command = line.replace(ENDPOINT, cluster["s3_url"])
            done = subprocess.run(["bash", "-o", "pipefail", "-c", command], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            out = done.stdout
        assert out.split()[0] == hashlib.md5(data).hexdigest()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
