"""Where the S3 gateway's CPU goes during one of ``bench s3``'s big cases: py-spy on
the gateway process while the case runs, then the functions by own and by total
samples (every thread, the hashing threads too).

    python -m bench.profile_s3_gateway [--gil] [CASE] [MIB] [REPEATS]

``--gil`` samples only the thread holding the GIL (the gateway's Python work, not its
threads waiting or hashing with the GIL let go): on a loaded machine a wall-clock
sample counts a thread waiting for a core as busy.  CASE is one of ``bench s3``'s
case names (default ``boto3 upload_fileobj``), MIB the object's size (default 512).
The raw stacks are left in ``s3-gateway.pyspy`` in the working directory
(``flamegraph.pl`` draws them).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from stager.testing.s3clients import moto_endpoint
from stager.testing.s3cluster import S3Cluster

from . import s3_null
from .bench_s3 import DATA_SERVERS, Bench
from .common import MiB, scratch

OUT = Path("s3-gateway.pyspy")


def top(raw: Path, rows: int = 25) -> None:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        samples += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            total[f] += int(n)
    print(f"{samples} samples")
    for name, counts in (("own", own), ("total", total)):
        for f, n in counts.most_common(rows):
            print(f"{name:5s} {n / samples:6.1%} {f[:140]}")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--gil"]
    gil = ["--gil"] if "--gil" in sys.argv[1:] else []
    case = args[0] if args else "boto3 upload_fileobj"
    mib = int(args[1]) if len(args) > 1 else 512
    repeats = int(args[2]) if len(args) > 2 else 2
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with scratch("s3prof") as tmp, moto_endpoint() as moto, \
            S3Cluster(tmp / "cluster", data_servers=DATA_SERVERS) as s3:
        bench = Bench(tmp, s3, moto, mib * MiB, 1)
        bench.settle()
        with s3_null.running(bench.local) as null:
            bench.null = null
            run = bench.cases([])[case]
            run()                   # warm: connections, the gateway's caches
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                    "--pid", str(bench.gateway.pid), *gil, "--format", "raw",
                                    "-r", "100", "-o", str(OUT), "--nonblocking"])
            time.sleep(1)
            for _ in range(repeats):
                print(f"{case}: {run():.0f} MB/s", flush=True)
            spy.send_signal(signal.SIGINT)
            spy.wait()
    top(OUT)


if __name__ == "__main__":
    main()
