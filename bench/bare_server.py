"""A bare aiohttp server under uvloop, in a process of its own: the floor that the
metadata server's round trips are set beside (``bench floors``), and a sink that
takes any load answered at once (``bench scale``'s share of the machine).

    python -m bench.bare_server [--sink]

answers ``GET /`` with ``{}`` (with ``--sink``: any method on any path, its body
read first), and prints its port once it listens.  :class:`BareServer` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

import uvloop
from aiohttp import web


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})


async def _read_ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({})


async def _serve(sink: bool) -> None:
    app = web.Application(client_max_size=1 << 24) if sink else web.Application()
    if sink:
        app.router.add_route("*", "/{tail:.*}", _read_ok)
    else:
        app.router.add_get("/", _ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


class BareServer:
    """The server in a subprocess: ``url`` (no trailing slash) and ``pid`` while it runs."""

    def __init__(self, sink: bool = False) -> None:
        self.sink = sink
        self.url, self.pid = "", 0

    def __enter__(self) -> BareServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bare_server", *(["--sink"] if self.sink else [])],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sink", action="store_true")
    uvloop.run(_serve(parser.parse_args().sink))


if __name__ == "__main__":
    main()
