#!/usr/bin/env bash
# The stager HTTP API with nothing but curl: write a file, read a range of it,
# list its directory, delete it.  Every step checks its answer; any failure
# exits non-zero.
#
#   clients/http_curl.sh [META_URL]
#
# META_URL defaults to $STAGER_META_URL, else http://127.0.0.1:7070 (`stager up`).
set -euo pipefail

META="${1:-${STAGER_META_URL:-http://127.0.0.1:7070}}"
META="${META%/}"
DIR="/examples/curl-$$-$RANDOM"          # a directory of our own in the namespace
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "http_curl.sh: $*" >&2; exit 1; }

# status METHOD URL [curl args...]: print the HTTP status, keep the body in $WORK/body
status() {
    local method="$1" url="$2"
    shift 2
    curl -sS -X "$method" -o "$WORK/body" -w '%{http_code}' "$@" "$url"
}

head -c 300000 /dev/urandom > "$WORK/sample.bin"

echo "1. PUT $DIR/sample.bin (300000 bytes, 64 KiB chunks)"
code=$(status PUT "$META/v1/files$DIR/sample.bin?chunk_size=65536" \
       --data-binary @"$WORK/sample.bin" -H 'Content-Type: application/octet-stream')
[ "$code" = 201 ] || fail "PUT answered $code: $(cat "$WORK/body")"
grep -q '"size":300000' "$WORK/body" || fail "PUT did not report the size: $(cat "$WORK/body")"

echo "2. GET bytes 1000-1999 (a ranged read)"
code=$(status GET "$META/v1/files$DIR/sample.bin" -H 'Range: bytes=1000-1999' -D "$WORK/headers")
[ "$code" = 206 ] || fail "ranged GET answered $code"
grep -qi '^content-range: bytes 1000-1999/300000' "$WORK/headers" || fail "wrong Content-Range"
# (pipes read their input to the end: with pipefail an early exit would be a failure)
head -c 2000 "$WORK/sample.bin" | tail -c 1000 > "$WORK/expected"
cmp -s "$WORK/expected" "$WORK/body" || fail "ranged GET returned the wrong bytes"

echo "3. GET the last 100 bytes (a suffix range), then the whole file"
code=$(status GET "$META/v1/files$DIR/sample.bin" -H 'Range: bytes=-100')
[ "$code" = 206 ] || fail "suffix GET answered $code"
tail -c 100 "$WORK/sample.bin" > "$WORK/expected"
cmp -s "$WORK/expected" "$WORK/body" || fail "suffix GET: wrong bytes"
curl -fsS "$META/v1/files$DIR/sample.bin" -o "$WORK/whole.bin"
cmp -s "$WORK/sample.bin" "$WORK/whole.bin" || fail "whole GET returned the wrong bytes"

echo "4. HEAD (size without the body)"
curl -fsSI "$META/v1/files$DIR/sample.bin" > "$WORK/headers"
grep -qi '^content-length: 300000' "$WORK/headers" || fail "HEAD did not give the size"

echo "5. GET the directory: a JSON listing"
code=$(status GET "$META/v1/files$DIR/")
[ "$code" = 200 ] || fail "listing answered $code"
grep -q "\"path\":\"$DIR/sample.bin\"" "$WORK/body" || fail "listing lacks the file: $(cat "$WORK/body")"

echo "6. DELETE the directory (recursive), then GET answers 404 with a JSON error"
code=$(status DELETE "$META/v1/files$DIR?recursive=true")
[ "$code" = 200 ] || fail "DELETE answered $code: $(cat "$WORK/body")"
grep -q '"removed":1' "$WORK/body" || fail "DELETE removed nothing: $(cat "$WORK/body")"
code=$(status GET "$META/v1/files$DIR/sample.bin")
[ "$code" = 404 ] || fail "GET after DELETE answered $code"
grep -q '"error":"not_found"' "$WORK/body" || fail "404 without a JSON error"

echo "ok: put, ranged get, list and delete over plain HTTP at $META"
