"""A static HTTP file server, the staging source of tests and benchmarks.

Serves a directory the way fsspec's HTTP filesystem expects to walk one: a
directory answers with an HTML index whose links end in ``/`` for
subdirectories; a file is served by aiohttp's ``FileResponse`` (byte ranges,
``ETag``, ``Last-Modified``, ``sendfile``).  Like a web server running as an
unprivileged user, it answers 403 for files that are not world-readable.

    python -m stager.testing.httpserver ROOT [--host 127.0.0.1] [--port 0]

prints ``http://HOST:PORT`` on its first line once it listens.
:class:`HttpServer` runs it as a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self
from urllib.parse import quote

from aiohttp import web

from ..web.server import start_sites, stop_sites

ROOT = web.AppKey("root", Path)


def _resolve(root: Path, tail: str) -> Path:
    path = (root / tail).resolve()
    if path != root and root not in path.parents:
        raise web.HTTPForbidden(text="outside the served directory")
    return path


def _index(root: Path, directory: Path) -> str:
    items = []
    for entry in sorted(directory.iterdir()):
        rel = entry.relative_to(root).as_posix()
        slash = "/" if entry.is_dir() else ""
        items.append(f'<li><a href="/{quote(rel)}{slash}">{html.escape(entry.name)}{slash}'
                     "</a></li>")
    return "<html><body><ul>\n" + "\n".join(items) + "\n</ul></body></html>"


async def serve_path(request: web.Request) -> web.StreamResponse:
    root = request.app[ROOT]
    path = _resolve(root, request.match_info["tail"])
    try:
        st = await asyncio.to_thread(path.stat)
    except FileNotFoundError:
        raise web.HTTPNotFound() from None
    if stat.S_ISDIR(st.st_mode):
        text = await asyncio.to_thread(_index, root, path)
        return web.Response(text=text, content_type="text/html")
    if not st.st_mode & stat.S_IROTH:
        raise web.HTTPForbidden(text="not world-readable")
    return web.FileResponse(path)


def make_app(root: Path) -> web.Application:
    app = web.Application()
    app[ROOT] = root.resolve()
    app.router.add_get("/{tail:.*}", serve_path)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` until cancelled, printing ``http://HOST:PORT`` once it listens."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sockets = await start_sites(runner, host, port)
    bound = sockets[0].getsockname()[1]                      # the bound port of port 0
    print(f"http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await stop_sites(runner, sockets)


def run_main(make: Callable[[Path], web.Application], description: str) -> None:
    """The command line of a server of this kind: ``ROOT [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("root")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        asyncio.run(serve(make(Path(args.root)), args.host, args.port))
    except KeyboardInterrupt:
        pass


class HttpServer:
    """The server in a subprocess; ``url`` is known once it listens.

    ``prefix`` goes before the command, e.g. ``NetnsFabric.netns_argv(i, [])`` to
    run it inside an emulated node (with ``host`` that node's address).
    """

    def __init__(self, root: str | os.PathLike[str], host: str = "127.0.0.1",
                 prefix: Sequence[str] = ()) -> None:
        self.root, self.host = Path(root), host
        self.prefix = list(prefix)
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    module = "stager.testing.httpserver"      # what ``python -m`` runs

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", self.module, str(self.root),
             "--host", self.host, "--port", "0"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.__exit__()
            raise RuntimeError(f"the HTTP server ({self.module}) did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


def main() -> None:
    run_main(make_app, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
