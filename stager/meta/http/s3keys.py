"""The S3 key routes: thin handlers over :class:`~stager.meta.s3keys.S3KeyService`.

``s3key_create`` and ``s3key_list`` take an admin token (as the token routes do);
``s3key_verify`` an S3 gateway's own credential (scope ``s3gateway``, or admin).  With
auth off there are no keys: each is a 404, saying so.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from ...auth.sealed import SealedBox
from ...config import Config
from ...errors import NotFound
from ...protocol.authmsg import TokenRequest
from ...protocol.s3keys import S3KeyList, S3VerifyRequest
from ...web.middleware import json_response
from ...web.requests import read_json
from ..auth import AUTH_DIR
from ..s3keys import KEY_FILE, S3KeyService
from ..service import MetaService
from .authapp import AUTH, NO_STORE

S3KEYS = web.AppKey("s3keys", S3KeyService)
MAX_BODY = 8192


def install(app: web.Application, service: MetaService, config: Config) -> None:
    """After :func:`~.authapp.install`: keys exist on a cluster with auth on."""
    auth = app.get(AUTH)
    if auth is None:
        return
    box = SealedBox.under(config.auth_dir or Path(config.root) / AUTH_DIR, KEY_FILE)
    app[S3KEYS] = S3KeyService(auth, box, service.store)


def _keys(request: web.Request) -> S3KeyService:
    keys = request.app.get(S3KEYS)
    if keys is None:
        raise NotFound("auth is off on this metadata server: an open cluster takes any S3 "
                       "credentials, and keeps none (start it with --auth)")
    return keys


async def s3key_create(request: web.Request) -> web.Response:
    req = TokenRequest.from_json(await read_json(request, MAX_BODY))
    # the secret and the token are shown this once: never recorded for a replay
    return json_response((await _keys(request).create(req)).to_json(), headers=NO_STORE)


async def s3key_list(request: web.Request) -> web.Response:
    return json_response(S3KeyList(tuple(await _keys(request).list())).to_json())


async def s3key_verify(request: web.Request) -> web.Response:
    req = S3VerifyRequest.from_json(await read_json(request, MAX_BODY))
    return json_response((await _keys(request).verify(req)).to_json(), headers=NO_STORE)


HANDLERS = {"s3key_create": s3key_create, "s3key_list": s3key_list,
            "s3key_verify": s3key_verify}
