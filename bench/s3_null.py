"""An S3 server that costs (almost) nothing: the ceiling an S3 client reaches here.

``python -m bench.s3_null FILE`` serves FILE's bytes from memory as every object of
every bucket (GET, ranged GET, HEAD) and takes every PUT, UploadPart and
CompleteMultipartUpload by reading the body and throwing it away: no signature
check, no hashing, no storage.  ``bench s3`` runs it as a process of its own and
measures boto3 and s3fs against it, so that each client's own CPU cost, the part
of the S3 path no gateway can remove, stands next to the gateway's ratio.  It
prints ``PORT`` on its first line once it listens.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

from stager.testing.s3clients import S3Endpoint

ETAG = '"0123456789abcdef0123456789abcdef"'
SLICE = 256 * 1024      # written in slices with a drain between: no transport copy
LAST_MODIFIED = "Mon, 07 Dec 2026 00:00:00 GMT"


def _span(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=A-B`` (the only form boto3 and s3fs send) as ``[start, stop)``."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header.removeprefix("bytes=").partition("-")
    start = int(first)
    return start, min(size, int(last) + 1 if last else size)


def app(data: bytes) -> web.Application:
    view = memoryview(data)

    async def get(request: web.Request) -> web.StreamResponse:
        span = _span(request.headers.get("Range"), len(data))
        start, stop = span or (0, len(data))
        headers = {"ETag": ETAG, "Last-Modified": LAST_MODIFIED, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if span:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        response = web.StreamResponse(status=206 if span else 200, headers=headers)
        response.content_length = stop - start
        await response.prepare(request)
        if request.method != "HEAD":
            for at in range(start, stop, SLICE):
                await response.write(view[at:min(stop, at + SLICE)])
        await response.write_eof()
        return response

    async def put(request: web.Request) -> web.StreamResponse:
        while await request.content.readany():
            pass
        return web.Response(headers={"ETag": ETAG})

    async def post(request: web.Request) -> web.StreamResponse:
        while await request.content.readany():
            pass
        key = request.match_info["key"]
        if "uploads" in request.query:
            body = ("<InitiateMultipartUploadResult><Bucket>b</Bucket>"
                    f"<Key>{key}</Key><UploadId>{uuid.uuid4().hex}</UploadId>"
                    "</InitiateMultipartUploadResult>")
        else:
            body = ("<CompleteMultipartUploadResult><Bucket>b</Bucket>"
                    f"<Key>{key}</Key><ETag>{ETAG}</ETag></CompleteMultipartUploadResult>")
        return web.Response(text=body, content_type="application/xml")

    application = web.Application(client_max_size=1 << 40)
    application.router.add_get("/{bucket}/{key:.+}", get)     # HEAD too
    application.router.add_put("/{bucket}/{key:.+}", put)
    application.router.add_put("/{bucket}", put)
    application.router.add_post("/{bucket}/{key:.+}", post)
    return application


@contextmanager
def running(path: Path) -> Iterator[S3Endpoint]:
    """The server on ``path``'s bytes, as a process of its own, while the block runs."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.s3_null", str(path)],
                            stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline() or 0)
        if not port:
            raise RuntimeError(f"bench.s3_null exited with {proc.wait()}")
        yield S3Endpoint(f"http://127.0.0.1:{port}", "null", "null-secret")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    import asyncio

    async def serve() -> None:
        runner = web.AppRunner(app(Path(sys.argv[1]).read_bytes()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
