"""CPU seconds per GiB of every process on ``bench s3``'s big cases, and the hashes'
floor: steadier than rates on a loaded 2-core machine, where a case's wall time moves
with the other tenants and its CPU much less.

    python -m bench.profile_s3_cpu [CASES] [MIB] [ROUNDS]

CASES: ``bench s3`` case names joined by commas (default ``boto3 upload_fileobj,
Client.put``), run in turn, the order reversed every other round; MIB the object's
size (default 256); ROUNDS (default 3).  Per case and round: its rate, the gateway's
CPU split into user and system time (``/proc/PID/stat``), the metadata server's, the
data servers' together and this process's (the clients).

The floor line is what the gateway cannot avoid on a PUT as boto3 sends it over
http: the MD5 of the ETag, the SHA-256 of ``x-amz-content-sha256`` (botocore signs
the payload where the endpoint is not https) and the CRC32 of its default checksum,
plus the CRC32C of stager's chunks, each over the same bytes once, measured here.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from stager.testing.s3clients import moto_endpoint
from stager.testing.s3cluster import S3Cluster

from . import s3_null
from .bench_s3 import DATA_SERVERS, Bench, hash_floor
from .common import GiB, MiB, scratch

TICK = os.sysconf("SC_CLK_TCK")


def user_system(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def main() -> None:
    args = sys.argv[1:]
    cases = (args[0] if args else "boto3 upload_fileobj,Client.put").split(",")
    mib = int(args[1]) if len(args) > 1 else 256
    rounds = int(args[2]) if len(args) > 2 else 3
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    gib = mib * MiB / GiB
    with scratch("s3cpu") as tmp, moto_endpoint() as moto, \
            S3Cluster(tmp / "cluster", data_servers=DATA_SERVERS) as s3:
        bench = Bench(tmp, s3, moto, mib * MiB, 1)
        bench.settle()
        floor = hash_floor(bench.local.read_bytes())
        print("hash floor, CPU s per GiB: " + ", ".join(f"{k} {v:.2f}" for k, v in floor.items())
              + f"; MD5 + SHA-256 + CRC32 {floor['MD5'] + floor['SHA-256'] + floor['CRC32']:.2f}")
        gateway, meta = bench.gateway.pid, s3.cluster.meta_pid()
        data = [s3.cluster.data_pid(i) for i in range(DATA_SERVERS)]
        with s3_null.running(bench.local) as null:
            bench.null = null
            run = bench.cases([])
            for r in range(rounds):
                for case in (cases if r % 2 == 0 else cases[::-1]):
                    g0, m0 = user_system(gateway), sum(user_system(meta))
                    d0, me0 = sum(sum(user_system(p)) for p in data), time.process_time()
                    figure = run[case]()
                    g1, m1 = user_system(gateway), sum(user_system(meta))
                    d1, me1 = sum(sum(user_system(p)) for p in data), time.process_time()
                    print(f"round {r} {case:24s} {figure:7.0f} MB/s; CPU s per GiB: gateway "
                          f"{(g1[0] + g1[1] - g0[0] - g0[1]) / gib:.2f} (user "
                          f"{(g1[0] - g0[0]) / gib:.2f}, system {(g1[1] - g0[1]) / gib:.2f}), "
                          f"meta {(m1 - m0) / gib:.2f}, data servers {(d1 - d0) / gib:.2f}, "
                          f"clients {(me1 - me0) / gib:.2f}; load {os.getloadavg()[0]:.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
