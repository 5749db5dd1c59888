"""A test HTTP source that can stall mid-answer: ``python tests/slow_source.py ROOT FLAG
[PORT]``.

It serves ``ROOT`` as :mod:`stager.testing.httpserver` does, except that while the file
``FLAG`` exists a ranged GET of a file answers its headers and half of its bytes, prints
``stalled PATH`` on its standard output, and sends nothing more: a source caught in the
middle of a read, for a test to kill (``tests/test_cache_killed.py``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from stager.testing.httpserver import ROOT, make_app
from stager.web.server import start_sites


def stalling(flag: Path) -> object:
    @web.middleware
    async def stall(request: web.Request, handler: object) -> web.StreamResponse:
        rng = request.http_range
        path = (request.app[ROOT] / request.match_info.get("tail", "")).resolve()
        if not flag.exists() or rng.start is None or not path.is_file():
            return await handler(request)           # type: ignore[operator]
        data = path.read_bytes()
        st = path.stat()
        start, stop = rng.start, min(rng.stop or len(data), len(data))
        resp = web.StreamResponse(status=206, headers={
            "Content-Range": f"bytes {start}-{stop - 1}/{len(data)}",
            "Content-Length": str(stop - start),
            "ETag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"'})
        await resp.prepare(request)
        await resp.write(data[start:start + (stop - start) // 2])
        print(f"stalled {path.name}", flush=True)
        await asyncio.sleep(3600)
        return resp
    return stall


async def main(root: Path, flag: Path, port: int) -> None:
    app = make_app(root)
    app.middlewares.append(stalling(flag))      # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sockets = await start_sites(runner, "127.0.0.1", port)
    print(f"http://127.0.0.1:{sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]),
                     int(sys.argv[3]) if len(sys.argv) > 3 else 0))
