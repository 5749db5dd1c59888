"""``python -m bench``: run the benchmarks, write results, render RESULTS.md and plots."""

from .runner import main

raise SystemExit(main())
