"""Mosaic Streaming's side of the Mosaic tests and benchmark, run by the Mosaic venv's
python (``.venv-mosaic``, ``make .venv-mosaic/.installed``), never imported by stager.

Mosaic (``mosaicml-streaming``) pins ``numpy<2.2`` and imports torchvision at
``import streaming``, so it cannot share stager's venv: :mod:`stager.testing.mosaic`
runs this file as a script in a venv of its own, with the S3 endpoint in the
environment (``S3_ENDPOINT_URL`` and the AWS credentials), and reads what it writes.
Only the standard library and Mosaic's own dependencies are imported here.

    python mosaic_job.py STEPS.json         # [[ACTION, SPEC], ...]: each in turn

    write   MDSWriter: samples from a pickle to ``out``
    read    StreamingDataset: every sample, to a pickle
    rate    one epoch timed

It prints the steps' results as one JSON list.  ``import streaming`` takes seconds
(it imports torch, torchvision and transformers), so one process runs every step.
A sample is ``{"id": int, "data": bytes}``; the pickles hold ``[(id, data), ...]``,
in the order written or read.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
import sys
import time
from typing import Any

COLUMNS = {"id": "int", "data": "bytes"}


def write(spec: dict[str, Any]) -> dict[str, Any]:
    """MDSWriter over ``spec["samples"]`` to ``spec["out"]`` (a local folder, or
    ``[local, remote]``: Mosaic uploads each shard to ``remote`` as it closes, and keeps
    the local copy only with ``keep_local``)."""
    from streaming import MDSWriter

    with open(spec["samples"], "rb") as f:
        samples = pickle.load(f)
    out = spec["out"] if isinstance(spec["out"], str) else tuple(spec["out"])
    with MDSWriter(out=out, columns=COLUMNS, compression=spec.get("compression"),
                   hashes=spec.get("hashes"), size_limit=spec.get("size_limit", 1 << 26),
                   keep_local=spec.get("keep_local", False), progress_bar=False) as writer:
        for i, data in samples:
            writer.write({"id": i, "data": data})
    return {"written": len(samples)}


def dataset(spec: dict[str, Any]) -> Any:
    """``StreamingDataset(remote=…, local=…)``; a ``remote`` of None reads ``local`` alone."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(remote=spec.get("remote"), local=spec["local"],
                            shuffle=spec.get("shuffle", True), shuffle_seed=spec.get("seed", 0),
                            batch_size=spec["batch_size"],
                            validate_hash=spec.get("validate_hash"))


def batches(spec: dict[str, Any]) -> Any:
    """The dataset's batches through torch's DataLoader with ``spec["workers"]`` (started
    with ``spec["context"]``, torch's default ``fork`` unless given)."""
    from torch.utils.data import DataLoader

    workers = spec.get("workers", 0)
    context = {"multiprocessing_context": spec.get("context", "fork")} if workers else {}
    return DataLoader(dataset(spec), batch_size=spec["batch_size"], num_workers=workers,
                      collate_fn=list, **context)


def read(spec: dict[str, Any]) -> dict[str, Any]:
    got = [(s["id"], s["data"]) for batch in batches(spec) for s in batch]
    with open(spec["into"], "wb") as f:
        pickle.dump(got, f)
    return {"read": len(got)}


def rate(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch: time to the first batch (from making the dataset) and samples/s after
    it.  ``spec["env"]`` is set first (Mosaic reads ``S3_ENDPOINT_URL`` at each download,
    so one process can time several endpoints); with ``cleanup`` the downloaded shards
    are removed after."""
    os.environ.update(spec.get("env", {}))
    start = time.perf_counter()
    it = iter(batches(spec))
    first = next(it)
    t_first = time.perf_counter()
    samples, nbytes = 0, sum(len(s["data"]) for s in first)
    for batch in it:
        samples += len(batch)
        nbytes += sum(len(s["data"]) for s in batch)
    end = time.perf_counter()
    del it
    if spec.get("cleanup"):
        shutil.rmtree(spec["local"], ignore_errors=True)
    return {"ttfb": t_first - start, "rate": samples / (end - t_first),
            "samples": samples + len(first), "bytes": nbytes}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        steps = json.load(f)
    actions = {"write": write, "read": read, "rate": rate}
    results = []
    for n, (action, spec) in enumerate(steps):
        print(f"mosaic_job: step {n}: {action} {json.dumps(spec)}", file=sys.stderr, flush=True)
        results.append(actions[action](spec))
        gc.collect()            # the step's dataset and its shared memory gone before the next
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
