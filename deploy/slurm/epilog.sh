#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/stager.sh): when a job ends on a
# node -- completed, failed, cancelled or killed -- nothing of its per-job stager
# cluster (`stager job up`) stays: its servers on this node are stopped (SIGTERM, then
# SIGKILL) and its node-local root removed; on the job's first node also the job
# directory with its tokens -- but where `job up` failed, its `failed` and `logs/` stay
# there for the user.  `stager job down` does the work: it finds the processes by the
# record job up left (/tmp/stager-job-ID.NODE.json, or $STAGER_JOB_RUN_DIR) and by their
# environment, and, run as root, touches only what belongs to $SLURM_JOB_UID.
#
# A job that never ran `stager job up` costs one stager start-up (no record, nothing
# found).  The epilog always exits 0: a failure here is logged, not a drained node.
# It is logged twice, as slurmd shows an epilog's output nowhere and a node without a
# syslog daemon drops what `logger` sends: to syslog (tag stager-epilog) and to
# $STAGER_EPILOG_LOG (default /var/log/stager-epilog.log); so is a kept `failed`/`logs/`.
# $STAGER: the command (word-split: "python3 -m stager" works)
STAGER=${STAGER:-$(command -v stager || echo /usr/local/bin/stager)}
LOG=${STAGER_EPILOG_LOG:-/var/log/stager-epilog.log}
[ -n "$SLURM_JOB_ID" ] || exit 0
NODE=${SLURMD_NODENAME:-$(hostname -s)}
say() {
    logger -t stager-epilog "$1" 2>/dev/null
    printf '%s stager-epilog: %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "$1" >>"$LOG" 2>/dev/null \
        || echo "stager-epilog: $1" >&2
}
if ! out=$($STAGER job down --quiet --job-id "$SLURM_JOB_ID" --node "$NODE" 2>&1); then
    say "job $SLURM_JOB_ID on $NODE: job down failed: $out"
elif [ -n "$out" ]; then
    say "job $SLURM_JOB_ID on $NODE: $out"
fi
exit 0
