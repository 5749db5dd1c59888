"""``stager job up|down|env``: a per-job cluster on the nodes of a Slurm allocation.

The logic is in :mod:`stager.deploy.jobcluster` and :mod:`stager.deploy.jobprocs`;
deploy/README.md has the recipe and deploy/slurm/epilog.sh the cleanup.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from ..deploy.jobprocs import run_dir, stop_node
from ..deploy.slurmenv import job_from_env, node_address


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def cmd_up(args: argparse.Namespace) -> int:
    from ..deploy.jobcluster import (
        JobClusterError,
        JobFiles,
        JobOptions,
        NodeUp,
        default_root,
        env_lines,
    )

    job = job_from_env(job_dir=args.job_dir, job_id=args.job_id)
    opts = JobOptions(
        root=Path(args.root) if args.root else default_root(job),
        host=node_address(job.node, args.host), run_dir=run_dir(args.run_dir),
        auth=not args.insecure, meta_port=args.meta_port, data_port=args.data_port,
        replicas=args.replicas, chunk_size=args.chunk_size, cache_limit=args.cache_limit,
        stage_in=tuple((src, dst) for src, dst in args.stage_in or ()),
        attach=tuple((src, dst) for src, dst in args.attach or ()),
        timeout=args.timeout, foreground=args.foreground)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if not args.quiet \
        else (lambda line: None)
    if args.foreground:
        # Slurm ends the step with SIGTERM, maybe while still starting: unwind through
        # NodeUp.run, which stops what this node started and removes its root.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _exit_on)
    try:
        cluster = NodeUp(job, opts, say).run()
    except JobClusterError as exc:
        print(f"stager job up: node {job.node}: {exc}", file=sys.stderr)
        logs = JobFiles(job.job_dir).logs
        if logs.is_dir():
            print(f"stager job up: the servers' logs: {logs}/ (kept after the job ends)",
                  file=sys.stderr)
        return 1
    if job.first:
        print(env_lines(cluster), end="", flush=True)
    if not args.foreground:
        return 0
    # --foreground: this step holds the servers until Slurm (or Ctrl-C) ends it.
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stopping.set())
    print(f"stager job up: node {job.node} up; its servers stop with this step", flush=True)
    stopping.wait()
    stop_node(job.job_id, job.node, opts.run_dir)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    job = job_from_env(job_dir=args.job_dir, job_id=args.job_id)
    node = args.node or job.node
    uid = int(os.environ["SLURM_JOB_UID"]) \
        if os.geteuid() == 0 and os.environ.get("SLURM_JOB_UID") else None
    report = stop_node(job.job_id, node, run_dir(args.run_dir), uid=uid,
                       root=args.root, keep_job_dir=args.keep_job_dir)
    if not args.quiet:
        print(f"stager job down: node {node}: stopped {len(report.killed)} process(es), "
              f"removed {', '.join(report.removed) or 'nothing'}", file=sys.stderr)
    if report.kept:         # also with --quiet: the only place the user learns of it
        print(f"stager job down: kept {', '.join(report.kept)}: `job up` failed; remove "
              "them once read", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from ..deploy.jobcluster import JobClusterError, env_lines, read_cluster

    job = job_from_env(job_dir=args.job_dir, job_id=args.job_id)
    try:
        print(env_lines(read_cluster(job.job_dir)), end="")
    except JobClusterError as exc:
        print(f"stager job env: {exc}", file=sys.stderr)
        return 1
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job-id", help="the Slurm job (default: $SLURM_JOB_ID)")
    p.add_argument("--job-dir", help="shared directory where the nodes meet (default: "
                                     "$STAGER_JOB_DIR, else $SLURM_SUBMIT_DIR/.stager-job-ID)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    job = sub.add_parser("job", help="a per-job cluster on node-local disks (Slurm)")
    cmds = job.add_subparsers(dest="job_command", metavar="SUBCOMMAND", required=True)

    p = cmds.add_parser("up", help="start this node's part (run once per node with srun)")
    _common(p)
    p.add_argument("--root", help="node-local directory for the servers' data, one per job "
                                  "and node (default: $TMPDIR/stager-job-ID.NODE, else "
                                  "/tmp/…); refused while live servers hold it")
    p.add_argument("--host", help="this node's address, bound and advertised (default: "
                                  "$SLURMD_NODENAME's address, else the first global one)")
    p.add_argument("--meta-port", type=int, default=0, help="metadata server port (node 0; "
                                                            "default: any free one)")
    p.add_argument("--data-port", type=int, default=0, help="data server port (default: any)")
    p.add_argument("--replicas", type=int, default=1, help="default replicas (default: 1)")
    p.add_argument("--chunk-size", help="default chunk size (default: 4MiB)")
    p.add_argument("--cache-limit", metavar="BYTES",
                   help="keep the bytes filled into attached directories under this "
                        "(e.g. 200GiB; default: no limit)")
    p.add_argument("--stage-in", nargs=2, action="append", metavar=("SRC", "DST"),
                   help="stage SRC (any fsspec URL on the shared tier) into DST, every "
                        "node copying its share; may be repeated")
    p.add_argument("--attach", nargs=2, action="append", metavar=("SRC", "DST"),
                   help="attach DST to SRC (any fsspec URL: a cached view, each chunk "
                        "fetched on first read) and warm it, instead of copying; may be "
                        "repeated")
    p.add_argument("--insecure", action="store_true",
                   help="no tokens: anyone who reaches the nodes' ports may read and write "
                        "(default: --auth, the admin token in the job directory, 0600)")
    p.add_argument("--foreground", action="store_true",
                   help="stay running until signalled, then stop this node's part (for "
                        "proctrack/cgroup: `srun … stager job up --foreground &`)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the other nodes (default: 120)")
    p.add_argument("--run-dir", help="where the node's record goes (default: "
                                     "$STAGER_JOB_RUN_DIR, else /tmp)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_up)

    p = cmds.add_parser("down", help="stop this node's part and remove its files "
                                     "(node 0 also removes the job directory)")
    _common(p)
    p.add_argument("--node", help="the node (default: $SLURMD_NODENAME)")
    p.add_argument("--root", help="node-local root to remove when no record names one")
    p.add_argument("--run-dir", help="where job up left its record (default: "
                                     "$STAGER_JOB_RUN_DIR, else /tmp)")
    p.add_argument("--keep-job-dir", action="store_true",
                   help="leave the job directory (tokens, logs) in place")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_down)

    p = cmds.add_parser("env", help="print export lines for the job's cluster "
                                    "(eval \"$(stager job env)\")")
    _common(p)
    p.set_defaults(func=cmd_env)
