"""Where small files and small samples spend their time: rates and CPU per process.

Two drivers, each printing its rate and the CPU seconds (user + system, from
``/proc``) every process spent, so a change can be compared with the code before
it on a shared machine, where CPU per file moves far less than the rate::

    python -m bench.profile_small stage --files 20000      # staging 16 KiB files
    python -m bench.profile_small stage --sources http,get,file,http   # side by side
    python -m bench.profile_small reads --samples 40000    # batched 16 KiB reads
    python -m bench.profile_small loader --rounds 5        # the Loader over tar shards
    python -m bench.profile_small loader-ab STAGER_EVENT_LOOP=asyncio,uvloop
    python -m bench.profile_small torch-ab --rounds 6      # StagerDataLoader share_bytes
    python -m bench.profile_small worker-reads             # an epoch vs worker 0 of 2's steps
    python -m bench.profile_small files --files 20000      # the Loader's files format
    python -m bench.profile_small chunks --rounds 4        # whole 4 MiB chunks, low mark on/off
    python -m bench.profile_small http-listing             # listing an HTTP source
    python -m bench.profile_small meta --files 2000        # create+commit rates
    python -m bench.profile_small group-commit             # the store thread's grouping

``stage``: a tree of 16 KiB files in 20 directories, served by the HTTP source
server (its own process) and read as ``file://``, staged into a metadata server
and 3 data servers (``stager up`` processes, fresh targets), one run per source.
``--sources`` names the runs, in order: ``http`` and ``file`` stage (each into
a fresh directory), ``get`` is fsspec ``get`` of the tree from the same HTTP
server to a local directory (the source's own read rate), ``rerun`` stages
from http again into the last ``http`` run's copy (every file unchanged).
``reads``: one packed file of 16 KiB samples on 4 data servers (processes),
read in shuffled batches of 256 with one ``POST /v1/read`` per target per batch,
4 batches in flight (as ``bench_small_samples``).
``worker-reads``: the same shards, an epoch read by one Loader against worker
0 of 2's steps of it (``Loader.for_worker``), alternating: machine CPU per
sample (``/proc/stat``), the client's and the data servers' CPU per sample,
requests and bytes read per sample.
``files``: the Loader's ``files`` format over 16 KiB files (one stager file and
one chunk each) on 3 data servers: machine, client and data server CPU per sample.
``chunks``: whole-chunk GETs (what the Loader reads a mostly covered chunk
with) of a 64 MiB file on one data server, 4 in flight, each round with the
raw client's ``SO_RCVLOWAT`` mark on and then off (``rawhttp.LOWAT_FROM``),
with the reads (``buffer_updated`` calls) per chunk.
``loader``: the ``Loader`` over the loader benchmark's 16 KiB tar shards (8
shards, 65,536 samples, 3 data servers), one epoch per round read as fast as
it goes (after the first batch; ``--no-shuffle``: in manifest order); also
prints the garbage collections the round made, per generation (and those until
its first batch, from making the Loader, which loads the shard index), and the
client's page faults per sample (``STAGER_LOADER_KEEP_FREED=0``: with malloc left alone).
``loader-ab NAME=A,B``: the same epochs in client processes against one
cluster, alternating between ``NAME=A`` and ``NAME=B`` (A B, B A, ...;
``--pairs``; ``--large``: 1 MiB samples), each process's median printed.
``torch-ab``: the same shards through ``StagerDataLoader(num_workers=2)``,
batches through shared memory and pickled, alternating in one process.

The modes live by role in :mod:`bench.profile_small_data`,
:mod:`bench.profile_small_loader` and :mod:`bench.profile_small_meta`; this
module is their command line.  To measure the code before a change, run them
from a copy of that tree (``git archive REV stager bench | tar -x -C /tmp/old``,
copy ``bench/profiling.py`` and ``bench/profile_small*.py`` into
``/tmp/old/bench``, then ``cd /tmp/old && PYTHONPATH=/tmp/old python -m
bench.profile_small ...``): the servers they start import ``stager`` from there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import stager

from . import profile_small_data as data
from . import profile_small_loader as loader
from . import profile_small_meta as meta


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_small", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("stage", help="stage 16 KiB files over http and file://")
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--sources", default="http,file")
    p = sub.add_parser("reads", help="batched reads of 16 KiB samples")
    p.add_argument("--samples", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("loader", help="the Loader over 16 KiB tar shards")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-shuffle", action="store_true", help="read in manifest order")
    p = sub.add_parser("loader-ab", help="Loader client processes alternating between "
                       "two values of an environment variable")
    p.add_argument("setting", help="NAME=A,B, e.g. STAGER_EVENT_LOOP=asyncio,uvloop")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="epochs per process")
    p.add_argument("--large", action="store_true", help="1 MiB samples, batches of 16")
    p = sub.add_parser("loader-client", help=argparse.SUPPRESS)
    p.add_argument("--meta", required=True)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--pids", type=json.loads, default={})
    p.add_argument("--batch", type=int, default=256)
    p = sub.add_parser("torch-ab", help="StagerDataLoader(2 workers), shared memory or pickled")
    p.add_argument("--rounds", type=int, default=6)
    p = sub.add_parser("worker-reads", help="a Loader's epoch against DataLoader worker "
                       "0 of 2's steps of it")
    p.add_argument("--rounds", type=int, default=4)
    p = sub.add_parser("files", help="the Loader's files format: one 16 KiB file a sample")
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=4)
    p = sub.add_parser("chunks", help="whole 4 MiB chunk GETs, SO_RCVLOWAT on and off")
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("http-listing", help="list an HTTP source of 16 KiB files")
    p.add_argument("--files", type=int, default=20_000)
    p = sub.add_parser("meta", help="create+commit rates through a metadata server")
    p.add_argument("--files", type=int, default=2000)
    p = sub.add_parser("group-commit", help="the metadata service with group commit off/on")
    p.add_argument("--files", type=int, default=3000)
    args = parser.parse_args()
    print(f"stager from {Path(stager.__file__).parent}", flush=True)
    if args.what == "stage":
        data.stage_small(args.files, args.sources.split(","))
    elif args.what == "reads":
        data.batched_reads(args.samples, args.rounds)
    elif args.what == "loader":
        loader.loader_epochs(args.rounds, shuffle=not args.no_shuffle)
    elif args.what == "loader-ab":
        loader.loader_ab(args.setting, args.pairs, args.rounds, args.large)
    elif args.what == "loader-client":
        loader.loader_client(args.meta, args.index, args.rounds, args.pids, args.batch)
    elif args.what == "torch-ab":
        loader.torch_workers_ab(args.rounds)
    elif args.what == "worker-reads":
        loader.worker_reads(args.rounds)
    elif args.what == "files":
        loader.files_epochs(args.files, args.rounds)
    elif args.what == "chunks":
        data.whole_chunks(args.rounds)
    elif args.what == "http-listing":
        data.http_listing(args.files)
    elif args.what == "meta":
        meta.metadata_rates(args.files)
    else:
        meta.group_commit(args.files)



if __name__ == "__main__":
    main()
