"""The CUDA path of the device feeder: pinned host memory, non-blocking copies on a
side stream, the consumer's stream ordered after exactly its batch's copies.
Marked ``gpu``; skipped where CUDA is absent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from stager.torch import DeviceFeeder  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MiB = 1 << 20


def batches(n: int, rows: int = 1024) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((rows, 256), i, dtype=np.float32), "y": np.arange(rows) + i}
            for i in range(n)]


def tensors(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    return [obj] if isinstance(obj, torch.Tensor) else []


def test_batches_arrive_on_the_device_with_the_right_values() -> None:
    feeder = DeviceFeeder(batches(6), device="cuda")
    for i, b in enumerate(feeder):
        assert b["x"].is_cuda and b["y"].is_cuda
        # used at once on the consumer's stream: correct only if it waited for the copy
        assert float((b["x"] * 2).sum()) == 2.0 * i * b["x"].numel()
        assert torch.equal(b["y"].cpu(), torch.arange(1024) + i)
    assert feeder.copies == 6 and feeder.pinned == 12


def test_host_side_is_pinned() -> None:
    feeder = DeviceFeeder(batches(1), device="cuda")
    list(feeder)
    host = tensors(feeder.last_host)
    assert host and all(t.is_pinned() for t in host)


def test_copies_run_on_a_side_stream_and_do_not_block() -> None:
    feeder = DeviceFeeder([], device="cuda")
    big = {"x": np.ones((64 * MiB,), dtype=np.float32)}        # 256 MiB
    current = torch.cuda.current_stream()
    torch.cuda._sleep(2_000_000_000)                         # keep the consumer's stream busy
    moved, done = feeder._stage(big)
    assert feeder.stream is not None and feeder.stream != current
    assert not done.query()              # non_blocking: staging returned before the copy ended
    done.synchronize()
    # the copy finished while the consumer's stream was still busy: it did not queue there
    assert not current.query()
    out = feeder._finish(moved, done)
    assert float(out["x"].sum()) == float(64 * MiB)
    torch.cuda.synchronize()


def test_feeder_stays_one_step_ahead() -> None:
    staged = []

    class Counting(DeviceFeeder):
        def _stage(self, batch: Any) -> Any:
            staged.append(int(batch["y"][0]))
            return super()._stage(batch)

    feeder = Counting(batches(4), device="cuda")
    it = iter(feeder)
    first = next(it)
    assert staged == [0, 1]          # batch 1 was already on its way when 0 was handed out
    assert int(first["y"][0]) == 0
    list(it)
    assert staged == [0, 1, 2, 3]
