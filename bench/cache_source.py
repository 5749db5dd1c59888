"""An HTTP source that counts what it is asked: the cache benchmark's data lake.

The test file server of :mod:`stager.testing.httpserver` (directory pages, byte
ranges, ``ETag``, ``sendfile``) with a count of the requests for files, by
method, and of the bytes the ranged GETs asked for.  The counts are the source's
own: a fill that the metadata server shares between readers is one request
here, a chunk fetched again after an eviction is another.  Unlike the tests'
:class:`stager.testing.countingsource.CountingSource`, which runs on a thread of
the test's own process, this one is a process of its own, so that it can run
inside a node's network namespace behind a capped link and take no CPU time from
the benchmark's Loader under its GIL; it counts HEADs too.

    python -m bench.cache_source ROOT [--host 127.0.0.1] [--port 0]

prints ``http://HOST:PORT`` once it listens; ``GET /.counts`` answers the counts
as JSON (never counted itself, and no directory page links to it).
:class:`CountingSource` runs it as a subprocess, inside a node's network
namespace when given that node's ``prefix`` and address.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from stager.testing.httpserver import ROOT, HttpServer, run_main, serve_path

COUNTS = "/.counts"
COUNTER = web.AppKey("counter", Counter)


def ranged_bytes(header: str, size: int) -> int:
    """Bytes a ``Range: bytes=A-B`` (or ``A-``) header asks of a file of ``size``."""
    try:
        first, _, last = header.removeprefix("bytes=").partition("-")
        start, end = int(first), min(size - 1, int(last) if last else size - 1)
    except ValueError:
        return 0
    return max(0, end - start + 1)


@web.middleware
async def count(request: web.Request,
                handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    if request.path != COUNTS:
        counter = request.app[COUNTER]
        path = request.app[ROOT] / request.path.lstrip("/")
        if path.is_file():
            counter[request.method] += 1
            if request.method == "GET" and "Range" in request.headers:
                counter["ranged GET"] += 1
                counter["ranged bytes"] += ranged_bytes(request.headers["Range"],
                                                        path.stat().st_size)
        else:
            counter["listing"] += 1
    return await handler(request)


async def counts(request: web.Request) -> web.Response:
    return web.json_response(dict(request.app[COUNTER]))


def make_app(root: Path) -> web.Application:
    app = web.Application(middlewares=[count])
    app[ROOT] = root.resolve()
    app[COUNTER] = Counter()
    app.router.add_get(COUNTS, counts)
    app.router.add_get("/{tail:.*}", serve_path)
    return app


class CountingSource(HttpServer):
    """The server in a subprocess (``prefix`` goes before the command, e.g.
    ``NetnsFabric.netns_argv(0, [])`` with ``host`` that node's address)."""

    module = "bench.cache_source"

    def counts(self) -> Counter[str]:
        """The requests so far: ``GET``, ``HEAD``, ``ranged GET``, ``ranged bytes``
        (asked for by ranged GETs) and ``listing`` (directory pages)."""
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(self.url + COUNTS, timeout=30) as resp:
            return Counter(json.load(resp))


def main() -> None:
    run_main(make_app, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
