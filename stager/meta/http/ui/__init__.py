"""The live dashboard at ``GET /ui/``: a page, a stylesheet and a script, shipped here.

No build step and nothing fetched from elsewhere: the script (``dashboard.js``)
polls the JSON API the CLI uses (``/v1/status``, ``/v1/jobs``) every two seconds
and draws the targets, the rebuild and scrub, the attached directories, the
quotas and pins, and the training jobs.  With auth on it asks for a token and
keeps it in the tab's ``sessionStorage``.  The files are public; the data behind
them needs a token like any other request.
``/ui/config.json`` tells the page whether to ask for one.
"""

from __future__ import annotations

import asyncio
from importlib import resources

from aiohttp import web

from ....errors import NotFound
from ....web.middleware import json_response
from ..authapp import AUTH

REFRESH_SECONDS = 2.0
FILES = {"": ("index.html", "text/html"), "index.html": ("index.html", "text/html"),
         "dashboard.js": ("dashboard.js", "text/javascript"),
         "dashboard.css": ("dashboard.css", "text/css")}
# The page may load only its own files and call only its own server's API.
HEADERS = {"Cache-Control": "no-cache",
           "Content-Security-Policy": "default-src 'none'; script-src 'self'; "
                                      "style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                                      "form-action 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff"}
_cache: dict[str, bytes] = {}


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    asset = request.match_info["asset"]
    if asset == "config.json":
        return json_response({"auth": request.app.get(AUTH) is not None,
                              "refresh_seconds": REFRESH_SECONDS}, headers=HEADERS)
    if asset not in FILES:
        raise NotFound(f"the dashboard has no file {asset!r}")
    name, content_type = FILES[asset]
    if name not in _cache:
        _cache[name] = await asyncio.to_thread(_read, name)
    return web.Response(body=_cache[name], content_type=content_type, charset="utf-8",
                        headers=HEADERS)


HANDLERS = {"dashboard": dashboard}
