"""Two commits side by side: the machinery of the ``bench.ab_*`` tools.

Each commit is checked out into a temporary git worktree.  Each round runs one
child Python program in each worktree in turn (its own ``stager`` first on
``PYTHONPATH``), the order reversed every other round, and the child prints one
JSON object of figures as its last line.  The medians of each figure and their
ratio after / before are printed and returned.  These are tools to see what a
change did on a machine too noisy for figures measured an hour apart to be
compared; they are not among ``python -m bench``'s benchmarks.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def worktrees(**commits: str) -> Iterator[dict[str, Path]]:
    """A detached worktree of each commit, by label; removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, Path] = {}
        try:
            for label, commit in commits.items():
                trees[label] = Path(tmp) / label
                subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach",
                                str(trees[label]), commit], check=True)
            yield trees
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(tree)], check=False)


def interleave(trees: dict[str, Path], rounds: int, child: str,
               argv: Callable[[], list[str]], *, timeout: float = 900
               ) -> dict[str, dict[str, float]]:
    """Run ``child`` (Python source) with ``argv()`` in each tree, ``rounds`` times,
    alternating the order; per figure, the median of each tree and after / before
    (the first tree is "before")."""
    seen: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for r in range(rounds):
        for label in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            done = subprocess.run(
                [sys.executable, "-c", child, *argv()],
                env=dict(os.environ, PYTHONPATH=str(trees[label])), cwd=trees[label],
                capture_output=True, text=True, timeout=timeout, check=True)
            seen[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r} {label}: {seen[label][-1]}", file=sys.stderr, flush=True)
    before, after = seen
    medians = {}
    for figure in seen[before][0]:
        b = statistics.median(x[figure] for x in seen[before])
        a = statistics.median(x[figure] for x in seen[after])
        medians[figure] = {before: b, after: a, f"{after} / {before}": round(a / b, 3)}
        print(f"{figure:40s} {before} {b:12.1f}  {after} {a:12.1f}  "
              f"{after} / {before} {a / b:.3f}")
    return medians
