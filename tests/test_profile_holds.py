"""``python -m bench.profile_holds`` (docs/scale.md quotes its figures) runs, at a
smoke test's size, and names the holds the docs read (the batch routes; a load this
small may not run the garbage collector)."""

from __future__ import annotations

import pytest

from bench.profile_holds import main


def test_the_profile_of_the_loop_holds_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--targets", "64", "--ranks", "64", "--window", "1"])
    out = capsys.readouterr().out
    assert "'errors': 0" in out
    assert "_handle_request /v1/heartbeats" in out and "_handle_request /v1/jobs" in out
