#!/usr/bin/env bash
# The namespace as a POSIX file system: mount it, put a file in with cp, list it,
# check it with md5sum, unmount.  Any failure exits non-zero; the mount is always
# undone.  Needs /dev/fuse and the `fuse` extra (pip install -e '.[fuse]').
#
#   clients/mount_example.sh [META_URL]
#
# META_URL defaults to $STAGER_META_URL, else http://127.0.0.1:7070 (`stager up`).
# MOUNTPOINT (environment) defaults to a new temporary directory.
set -euo pipefail

META="${1:-${STAGER_META_URL:-http://127.0.0.1:7070}}"
STAGER="${STAGER:-stager}"            # the command; e.g. "python -m stager"
MNT="${MOUNTPOINT:-$(mktemp -d)}"
WORK="$(mktemp -d)"
DIR="examples/mount-$$-$RANDOM"           # a directory of our own in the namespace
mkdir -p "$MNT"
cleanup() {
    if mountpoint -q "$MNT"; then $STAGER umount "$MNT" || $STAGER umount --lazy "$MNT"; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

head -c 5000000 /dev/urandom > "$WORK/sample.bin"

echo "1. stager mount $MNT"
$STAGER --meta "$META" mount "$MNT"          # returns once the mount answers

echo "2. cp a 5 MB file in, as into any directory"
mkdir -p "$MNT/$DIR"
cp "$WORK/sample.bin" "$MNT/$DIR/sample.bin"

echo "3. ls -l"
ls -l "$MNT/$DIR"

echo "4. md5sum through the mount"
want=$(md5sum < "$WORK/sample.bin" | cut -d' ' -f1)
got=$(md5sum < "$MNT/$DIR/sample.bin" | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "mount_example.sh: md5 mismatch: $got != $want" >&2; exit 1; }
echo "   md5 ok: $got"

rm -r "$MNT/$DIR"                        # through the mount, like any directory
echo "5. stager umount $MNT"
$STAGER umount "$MNT"
