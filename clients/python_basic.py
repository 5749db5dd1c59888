"""A basic stager client in Python: put, ls, stat, cat a range, get, rm.

    python clients/python_basic.py [META_URL]

META_URL defaults to $STAGER_META_URL, else http://127.0.0.1:7070 (what
``stager up`` listens on).  Every step checks its result; the script exits
non-zero on any failure.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import uuid
from pathlib import Path

import stager
from stager.protocol.models import LayoutSpec


def main(meta_url: str | None) -> int:
    remote = f"/examples/python-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp, stager.Client(meta_url) as client:
        print(f"cluster at {client.meta_url}")
        local = Path(tmp) / "sample.bin"
        data = os.urandom(10 * 1024 * 1024 + 123)        # a little over 2.5 default chunks
        local.write_bytes(data)

        # put: a local file in; the layout is optional (default: 4 MiB chunks over
        # every healthy target, at most 8)
        [info] = client.put(local, f"{remote}/sample.bin", layout=LayoutSpec(replicas=1))
        print(f"put  {info.path}: {info.size} bytes in chunks of {info.layout.chunk_size}"
              f" over {info.layout.stripe_count} targets")
        check(info.size == len(data), "put reported the wrong size")

        # ls: the directory, one page at a time under the hood
        names = [entry.name for entry in client.ls(remote)]
        print(f"ls   {remote}: {names}")
        check(names == ["sample.bin"], "ls did not list the file")

        # stat: size and the layout, which says where every chunk lives
        st = client.stat(f"{remote}/sample.bin", cached=False)
        print(f"stat size={st.size} targets={list(st.layout.targets)}")
        check(st.size == len(data) and st.layout is not None, "stat disagrees with put")

        # cat a range: bytes [start, end) fetched from the targets in parallel
        start, end = 4 * 1024 * 1024 - 10, 4 * 1024 * 1024 + 10
        part = client.cat(f"{remote}/sample.bin", start, end)
        print(f"cat  [{start}, {end}) -> {len(part)} bytes across a chunk boundary")
        check(part == data[start:end], "cat returned the wrong bytes")

        # get: the file back to local disk
        back = Path(tmp) / "back.bin"
        client.get(f"{remote}/sample.bin", back)
        same = hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
        print(f"get  {back.name}: {'identical' if same else 'DIFFERENT'}")
        check(same, "get returned different bytes")

        # rm: recursively, then the path is gone
        removed = client.rm(remote, recursive=True)
        print(f"rm   {remote}: {removed} file(s)")
        check(removed == 1 and not client.exists(remote), "rm left something behind")
    print("ok")
    return 0


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SystemExit(f"python_basic.py: {message}")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
    except OSError as exc:
        # stager's errors are built-in ones: an unreachable cluster is a ConnectionError,
        # a missing file a FileNotFoundError; both are OSErrors.
        sys.exit(f"python_basic.py: error: {exc}")
