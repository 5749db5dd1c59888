"""Where large-file staging spends its time: the rate and the CPU per GB of every process.

    python -m bench.profile_stage --files 4 --mib 256 --rounds 2 [--sources http,file]
    py-spy record -r 200 -f raw -o stage.txt --subprocesses -- \\
        python -m bench.profile_stage --rounds 3

Stages a tree of large files from the HTTP source server (its own process) and
as ``file://`` into a metadata server and 3 data servers (``stager up``
processes), one run per source per round, and prints the rate and the CPU
seconds (user + system, from ``/proc``) per GB of each process: on a shared
2-core machine the CPU split moves much less than the rate.  ``--get`` adds
fsspec ``get`` from the same HTTP server (the source's own read rate) for
comparison.  To measure older code, run it from a copy of that tree as the
docstring of :mod:`bench.profile_small` says.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import stager

from .common import MiB, write_local
from .profiling import measured, report


def profile(files: int, mib: int, rounds: int, sources: list[str], get: bool,
            options: dict[str, Any]) -> None:
    from stager.testing.cluster import ProcessCluster
    from stager.testing.httpserver import HttpServer

    from .bench_stage import _drop, fsspec_get, stage

    with tempfile.TemporaryDirectory(prefix="profile-stage-large-") as tmp:
        root = Path(tmp)
        src = root / "src" / "large"
        for i in range(files):
            write_local(src / f"part-{i}.bin", mib * MiB, seed=i)
        os.sync()       # the new source files' writeback must not compete with the runs
        nbytes = files * mib * MiB
        with HttpServer(root / "src") as http, ProcessCluster(root / "cluster", 3) as cluster:
            stage(cluster.meta_url, f"{http.url}/large/", "/warm", include=["part-0.bin"])
            asyncio.run(_drop(cluster.meta_url, "/warm"))
            pids = {"meta": int(cluster.info["meta"]["pid"]), "http source": http.proc.pid,
                    **{f"data{i}": cluster.data_pid(i) for i in range(3)}}
            for r in range(rounds):
                if get:
                    wall, used = measured(pids, lambda: fsspec_get(f"{http.url}/large",
                                                                   root / "get"))
                    report(f"round {r} fsspec get http", nbytes // MiB, "MiB", wall, used,
                           1024)
                for source in sources:
                    url = f"{http.url}/large/" if source == "http" else f"file://{src}"
                    dst = f"/{source}-{r}"

                    def work(url: str = url, dst: str = dst) -> None:
                        assert stage(cluster.meta_url, url, dst, **options)[1] == files

                    wall, used = measured(pids, work)
                    report(f"round {r} stage {source}", nbytes // MiB, "MiB", wall, used, 1024)
                    asyncio.run(_drop(cluster.meta_url, dst))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256, help="MiB per file")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sources", default="http,file")
    parser.add_argument("--get", action="store_true", help="also time fsspec get (http)")
    parser.add_argument("--large-files-in-flight", type=int, default=None)
    parser.add_argument("--window", type=int, default=None, help="ranged reads per file")
    parser.add_argument("--part-mib", type=int, default=None, help="MiB per ranged read")
    args = parser.parse_args()
    part = args.part_mib * MiB if args.part_mib else None
    options = {k: v for k, v in (("large_files_in_flight", args.large_files_in_flight),
                                 ("window", args.window), ("part_size", part)) if v is not None}
    print(f"stager from {Path(stager.__file__).parent}", flush=True)
    profile(args.files, args.mib, args.rounds, args.sources.split(","), args.get, options)


if __name__ == "__main__":
    main()
