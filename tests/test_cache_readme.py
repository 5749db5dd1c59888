"""The README's Caching commands, run as written against a real ``stager up``.

The console block under **Caching** is read line by line (``$ `` lines, comments and a
trailing ``&`` dropped) and each command runs in a subprocess, in order.  Three
things of the reader's machine are this test's own: the root ``/tmp/st`` is a
temporary directory, ``stager up`` gets ``--port 0`` after the README's flags, and the
S3 endpoint ``http://minio:9000`` is moto's server on loopback (tests/test_stage_s3.py's
fixture), whose bucket ``bucket`` holds ``imagenet/``.  The credentials are in the
servers' environment only (the README passes none): the metadata server reads the
source, not the client.  Then every file reads byte-exact from the cache without one
more GetObject, and ``stager status`` showed the attachment.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow      # stager up and moto's S3 server

pytest.importorskip("boto3", reason="needs the dev extra (boto3, via moto)")
pytest.importorskip("s3fs", reason="needs the dev extra (s3fs)")
pytest.importorskip("moto.server", reason="needs the dev extra (moto[server])")

import test_stage_s3  # noqa: E402
from test_stage_s3 import KEY, S3, SECRET, _aws_env  # noqa: E402

from stager import Client  # noqa: E402
from stager.config import load_config  # noqa: E402

s3 = test_stage_s3.s3          # the moto server fixture, shared by name

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
ROOT, ENDPOINT = "/tmp/st", "http://minio:9000"


def caching_commands() -> list[list[str]]:
    """The argument lists of the README's Caching block, in order."""
    text = README.read_text()
    section = text[text.index("**Caching**"):]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None, "README.md's Caching section has no console block"
    lines = re.findall(r"^\$ (.*)$", block.group(1), re.M)
    commands = [shlex.split(line, comments=True) for line in lines]
    return [c[:-1] if c[-1] == "&" else c for c in commands]


def test_the_readme_shows_up_attach_and_warm() -> None:
    commands = caching_commands()
    assert all(c[0] == "stager" for c in commands), commands
    verbs = [c[1] for c in commands]
    assert verbs[0] == "up" and "--cache-limit" in commands[0]
    assert {"attach", "warm"} <= set(verbs)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The README's ``stager up`` line, running; its root and the environment of the
    commands after it."""
    argv = caching_commands()[0]
    root = tmp_path / "st"
    argv = [root.as_posix() if a == ROOT else a for a in argv] + ["--port", "0"]
    servers_env = {**_aws_env(), "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    log = open(tmp_path / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", *argv], env=servers_env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (root / "cluster.json").exists():
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "stager up did not start in time"
            time.sleep(0.05)
        meta = json.loads((root / "cluster.json").read_text())["meta"]["url"]
        env = {k: v for k, v in _aws_env().items() if not k.startswith("STAGER_")}
        yield root, {**env, "STAGER_META_URL": meta}
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_the_readme_caching_commands_run_as_written(
        s3: S3, up: tuple[Path, dict[str, str]], payload: Callable[[int], bytes]) -> None:
    _, env = up
    s3.api.create_bucket(Bucket="bucket")
    files = {f"train/shard-{i}.tar": payload(700_000 + i) for i in range(3)}
    files["labels.txt"] = b"cat\ndog\n"
    for rel, data in files.items():
        s3.api.put_object(Bucket="bucket", Key=f"imagenet/{rel}", Body=data)
    outputs = {}
    for argv in caching_commands()[1:]:
        argv = [a.replace(ENDPOINT, s3.endpoint) for a in argv]
        done = subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        outputs[argv[1]] = done.stdout
    assert "/datasets/imagenet" in outputs["status"]
    seen = len(s3.log)
    with Client(env["STAGER_META_URL"], config=load_config(env={})) as client:
        [attached] = client.attachments()
        assert (attached.path, attached.source) == ("/datasets/imagenet",
                                                    "s3://bucket/imagenet")
        assert attached.cached_bytes == sum(map(len, files.values()))     # warmed
        for rel, data in files.items():
            assert client.cat(f"/datasets/imagenet/{rel}") == data, rel
    assert not [r for r in s3.requests(seen) if r.method == "GET"
                and r.path.startswith("/bucket/imagenet/")]               # all cached

