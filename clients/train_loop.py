"""A tiny training loop on stager's Loader (numpy only): logistic regression on a
synthetic Parquet dataset, with a checkpoint of the loader's position half-way
through and an exact resume from it, then the loader's telemetry.

    python clients/train_loop.py [META_URL]

META_URL defaults to $STAGER_META_URL, else http://127.0.0.1:7070 (what
``stager up`` listens on).  The dataset is written under /examples and removed
at the end.  Every step checks its result; the script exits non-zero on failure.
"""

from __future__ import annotations

import io
import json
import sys
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import stager

FEATURES = 16
ROWS_PER_FILE = 4096
FILES = 4
BATCH = 256
EPOCHS = 3
STEP_SECONDS = 0.002        # pretend each step also does some accelerator work


def write_dataset(client: stager.Client, path: str, rng: np.random.Generator) -> np.ndarray:
    """Rows (x, y) with y = [x·w > 0] for a hidden w; returns w."""
    w = rng.normal(size=FEATURES)
    for f in range(FILES):
        x = rng.normal(size=(ROWS_PER_FILE, FEATURES)).astype(np.float32)
        y = (x @ w > 0).astype(np.float32)
        table = pa.table({"x": pa.FixedSizeListArray.from_arrays(x.ravel(), FEATURES),
                          "y": y})
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=1024)
        client.pipe(f"{path}/part-{f}.parquet", buf.getvalue())
    return w


def step(weights: np.ndarray, batch: dict[str, np.ndarray], lr: float = 0.5) -> float:
    """One SGD step of logistic regression; returns the batch loss."""
    x = np.stack(batch["x"]).astype(np.float32)
    y = batch["y"]
    p = 1 / (1 + np.exp(-(x @ weights)))
    weights -= lr * x.T @ (p - y) / len(y)
    time.sleep(STEP_SECONDS)
    eps = 1e-7
    return float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))


def train(meta_url: str | None, path: str, weights: np.ndarray, epochs: range,
          state: dict | None, stop_after: int | None) -> tuple[dict, dict, list[float]]:
    """Run ``epochs`` from ``state``; stop after ``stop_after`` steps (a "preemption")."""
    losses: list[float] = []
    with stager.Loader(path, meta_url=meta_url, batch_size=BATCH, seed=1234,
                       output="numpy") as loader:
        if state is not None:
            loader.load_state_dict(state)
        for epoch in epochs:
            if epoch < loader.epoch:
                continue
            loader.set_epoch(epoch)
            for batch in loader:
                losses.append(step(weights, batch))
                if stop_after is not None and len(losses) == stop_after:
                    return loader.state_dict(), loader.stats(), losses
        return loader.state_dict(), loader.stats(), losses


def main(meta_url: str | None) -> int:
    rng = np.random.default_rng(0)
    path = f"/examples/train-{uuid.uuid4().hex[:8]}"
    with stager.Client(meta_url) as client:
        print(f"cluster at {client.meta_url}")
        hidden = write_dataset(client, path, rng)
        print(f"wrote {FILES} Parquet files, {FILES * ROWS_PER_FILE} rows, under {path}")
        try:
            weights = np.zeros(FEATURES)
            steps_per_epoch = FILES * ROWS_PER_FILE // BATCH
            # run until half-way through epoch 1, as if the job were preempted there
            state, _, first = train(meta_url, path, weights, range(EPOCHS), None,
                                    stop_after=steps_per_epoch + steps_per_epoch // 2)
            print(f"checkpoint after {len(first)} steps: {json.dumps(state)}")
            check(state["epoch"] == 1 and state["cursor"] == steps_per_epoch // 2 * BATCH,
                  "the checkpoint is not where the loop stopped")
            # a new job resumes from the checkpoint and finishes the epochs
            _, stats, rest = train(meta_url, path, weights, range(EPOCHS), state, None)
            check(len(first) + len(rest) == EPOCHS * steps_per_epoch,
                  "the resumed job did not read exactly the remaining batches")
            accuracy = evaluate(client, path, weights)
            cosine = float(weights @ hidden / np.linalg.norm(weights) / np.linalg.norm(hidden))
            print(f"loss {np.mean(first[:10]):.3f} -> {np.mean(rest[-10:]):.3f}, "
                  f"accuracy {accuracy:.3f}, cos(w, hidden) {cosine:.3f}")
            check(accuracy > 0.9, "the model did not learn")
            print("loader stats (resumed job): " + json.dumps(summary(stats)))
            check(stats["batches"] == len(rest) and stats["bytes"] > 0, "stats are off")
        finally:
            client.rm(path, recursive=True)
    print("ok")
    return 0


def evaluate(client: stager.Client, path: str, weights: np.ndarray) -> float:
    with stager.Loader(path, meta_url=client.meta_url, batch_size=1024, shuffle=False,
                       drop_last=False, output="numpy") as loader:
        right = total = 0
        for batch in loader:
            x = np.stack(batch["x"])
            right += int(np.sum(((x @ weights) > 0) == (batch["y"] > 0.5)))
            total += len(batch["y"])
    return right / total


def summary(stats: dict) -> dict:
    keep = ("samples", "batches", "bytes", "stall_fraction", "time_to_first_batch",
            "fetch_seconds", "decode_seconds", "samples_per_second")
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items() if k in keep}
    out["targets"] = {t: {"bytes": v["bytes"], "mean_latency_ms": round(1000 * v["mean_latency"],
                                                                        2)}
                      for t, v in stats["targets"].items()}
    return out


def check(ok: bool, message: str) -> None:
    if not ok:
        print(f"FAILED: {message}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else None))
