"""Mosaic Streaming (``mosaicml-streaming``) in its own venv, driven from stager's.

Mosaic pins ``numpy<2.2`` and imports torchvision at ``import streaming`` (its
``streaming.vision``), and PyPI's torchvision loads only beside a CUDA build of torch:
it lives in ``.venv-mosaic`` (``make .venv-mosaic/.installed``), apart from the
project's venv.  :func:`run_jobs` runs :mod:`stager.testing.mosaic_job` there as a
script, with the S3 endpoint Mosaic reads from the environment (``S3_ENDPOINT_URL``,
the AWS credentials); what it writes and reads crosses as files.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .s3clients import ClientMissing, S3Endpoint, machine_free_env

JOB = Path(__file__).with_name("mosaic_job.py")
VENV = Path(__file__).resolve().parents[2] / ".venv-mosaic"


def mosaic_python() -> str:
    """The python of the Mosaic venv (``STAGER_MOSAIC_PYTHON``, else the checkout's
    ``.venv-mosaic``), once its ``streaming`` package is there."""
    python = Path(os.environ.get("STAGER_MOSAIC_PYTHON") or VENV / "bin" / "python")
    if not python.exists():
        raise ClientMissing(f"no {python}: `make .venv-mosaic/.installed` makes Mosaic's venv")
    found = list(python.parent.parent.glob("lib/python*/site-packages/streaming/__init__.py"))
    if not found:
        raise ClientMissing(f"{python.parent.parent} has no mosaicml-streaming (its install "
                            "failed: see `make .venv-mosaic/.installed`)")
    return str(python)


def mosaic_env(endpoint: S3Endpoint | None = None) -> dict[str, str]:
    """The job's environment: nothing of the machine's AWS settings, and with
    ``endpoint`` Mosaic's S3 endpoint (``S3_ENDPOINT_URL``) and its credentials."""
    env = machine_free_env()
    env.pop("PYTHONPATH", None)
    if endpoint is not None:
        env.update(S3_ENDPOINT_URL=endpoint.url, AWS_ACCESS_KEY_ID=endpoint.access_key,
                   AWS_SECRET_ACCESS_KEY=endpoint.secret_key,
                   AWS_DEFAULT_REGION=endpoint.region)
    return env


def run_jobs(steps: Sequence[tuple[str, dict[str, Any]]], endpoint: S3Endpoint | None = None,
             timeout: float = 600) -> list[dict[str, Any]]:
    """Runs ``mosaic_job.py`` with ``steps`` (``(action, spec)`` each, in turn) in one
    process of the Mosaic venv; returns each step's result.  A failure raises with the
    job's output."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([list(step) for step in steps], f)
    try:
        done = subprocess.run([mosaic_python(), str(JOB), f.name],
                              env=mosaic_env(endpoint), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise AssertionError(f"mosaic_job.py {[a for a, _ in steps]} exited {done.returncode}\n"
                             f"stdout: {done.stdout[-4000:]}\nstderr: {done.stderr[-8000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
