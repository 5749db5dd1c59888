"""The metadata server's side of auth: the gate, the token routes, capabilities.

:func:`install` turns auth on for a metadata server whose config says so: the
signing key under ``ROOT/auth/``, the bootstrap admin token in
``ROOT/admin.token``, the :class:`~stager.web.authmw.TokenGate` on every route.
The handlers here answer the ``auth_key``, ``create_token``, ``list_tokens``,
``revoke_token`` and ``capabilities`` routes; with auth off the first four are a
404 and ``capabilities`` answers null for every file (a client holding a token
works against an open cluster too).  The path checks of the namespace routes
whose paths are in their bodies are here too (:func:`check_uploads`), next to
what they protect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from aiohttp import web

from ...aio import cancel_and_wait
from ...auth.policy import allows, granted
from ...config import Config
from ...errors import Forbidden, NotFound, StagerError
from ...protocol.authmsg import CapabilityRequest, PublicKey, TokenCreated, TokenList, TokenRequest
from ...protocol.batch import results_json
from ...protocol.paths import normalize
from ...web.authmw import GATE, TokenGate, authorize, quiet_audit, token_of
from ...web.middleware import json_response
from ...web.requests import read_json
from ..auth import ADMIN_TOKEN_FILE, AUTH_DIR, REVOKED_REFRESH, MetaAuth
from ..service import MetaService
from ..store.base import Upload

log = logging.getLogger("stager.meta")
AUTH = web.AppKey("auth", MetaAuth)
NO_STORE = {"Cache-Control": "no-store"}    # an answer that carries a secret


def install(app: web.Application, service: MetaService, config: Config) -> None:
    """Turn auth on for ``app`` when ``config.auth`` says so."""
    if not config.auth:
        return
    auth = MetaAuth.under(config.auth_dir or Path(config.root) / AUTH_DIR, service.store,
                          capability_ttl=config.capability_ttl)
    quiet_audit()
    app[AUTH] = auth
    app[GATE] = TokenGate(auth.authenticate)

    async def start(app: web.Application) -> AsyncIterator[None]:
        await auth.start()
        written = await auth.write_admin_token(
            config.admin_token_file or Path(config.root) / ADMIN_TOKEN_FILE)
        if written is not None:
            log.warning("auth on: an admin token was written to %s (mode 0600)", written)
        task = asyncio.create_task(_refresh_revoked(auth)) if service.store.shared else None
        yield
        if task is not None:
            await cancel_and_wait([task])

    app.cleanup_ctx.append(start)


async def _refresh_revoked(auth: MetaAuth) -> None:
    """Other metadata servers share the store: what they revoke is refused here too,
    within :data:`~.auth.REVOKED_REFRESH` seconds."""
    while True:
        await asyncio.sleep(REVOKED_REFRESH)
        try:
            await auth.refresh()
        except (StagerError, OSError) as exc:    # the database is down: the set stays
            log.debug("reading revoked tokens failed: %s", exc)


def auth_of(request: web.Request) -> MetaAuth | None:
    return request.app.get(AUTH)


def _auth(request: web.Request) -> MetaAuth:
    auth = auth_of(request)
    if auth is None:
        raise NotFound("auth is off on this metadata server (start it with --auth)")
    return auth


def read_capability(request: web.Request, file_id: str | None) -> str | None:
    """A read capability for the file ``file_id`` (a stat's), when auth is on."""
    auth, token = auth_of(request), token_of(request)
    if auth is None or token is None or file_id is None:
        return None
    return auth.capability(file_id, "read", token.id)


def write_capability(request: web.Request, file_id: str) -> str | None:
    """A write capability for the upload ``file_id``, when auth is on."""
    auth, token = auth_of(request), token_of(request)
    if auth is None or token is None:
        return None
    return auth.capability(file_id, "write", token.id)


async def check_uploads(request: web.Request, service: MetaService,
                        file_ids: Sequence[str]) -> None:
    """The token must grant write on the path of every upload named (an id that is no
    upload is left for the operation itself to refuse, item by item)."""
    if token_of(request) is None:
        return
    for file_id, upload in zip(file_ids, await service.store.get_uploads(list(file_ids)),
                               strict=True):
        if isinstance(upload, Upload):
            _authorize_file(request, "write", file_id, upload.path)


# -- routes ----------------------------------------------------------------------------
async def auth_key(request: web.Request) -> web.Response:
    return json_response(PublicKey(_auth(request).public_text).to_json())


async def create_token(request: web.Request) -> web.Response:
    auth = _auth(request)
    req = TokenRequest.from_json(await read_json(request, 1 << 20))
    text, info = await auth.mint(req)
    # shown this once: never recorded for a replay (stager/web/idempotency.py)
    return json_response(TokenCreated(text, info).to_json(), headers=NO_STORE)


async def list_tokens(request: web.Request) -> web.Response:
    return json_response(TokenList(tuple(await _auth(request).list())).to_json())


async def revoke_token(request: web.Request) -> web.Response:
    info = await _auth(request).revoke(request.match_info["token_id"])
    return json_response(info.to_json())


async def capabilities(request: web.Request, service: MetaService,
                       max_body: int) -> web.Response:
    req = CapabilityRequest.from_json(await read_json(request, max_body))
    auth, token = auth_of(request), token_of(request)
    if auth is None or token is None:
        return json_response(results_json(
            list(req.file_ids), lambda f: {"file_id": f, "capability": None}))
    found: list[str | StagerError] = list(req.file_ids)
    if req.op == "write" or not allows(token, req.op, None):
        # Each file's path must be covered (a write, whoever asks: only a file being
        # written gets a write capability, never a committed one).
        found = await _paths(service, req)
        for file_id, path in zip(req.file_ids, found, strict=True):
            if isinstance(path, str):
                _authorize_file(request, req.op, file_id, path)
        found = [f if isinstance(p, str) else p
                 for f, p in zip(req.file_ids, found, strict=True)]
    else:
        authorize(request, req.op, None)
    # One capability per batch of the files found (a plan's worth), not one per file,
    # and its text once: on the batch's first file, null on the others (the item
    # before's), where 256 copies of a 7.5 KB text made a 1.9 MB answer to encode
    # and decode.  A null answer throughout still says auth is off.
    texts = iter(_once(auth.capabilities([f for f in found if isinstance(f, str)],
                                         req.op, token.id)))
    return json_response(results_json(
        found, lambda f: {"file_id": f, "capability": next(texts)}))


def _once(texts: list[str]) -> list[str | None]:
    """``texts`` with each repeat of the text before it as ``None``."""
    return [t if i == 0 or t != texts[i - 1] else None for i, t in enumerate(texts)]


def _authorize_file(request: web.Request, op: str, file_id: str, path: str) -> None:
    """:func:`authorize` for the file ``file_id`` at ``path``, whose refusal names the
    file id only: where a file the token does not cover lives is none of its business."""
    token = token_of(request)
    if token is not None and op in granted(token) and not allows(token, op, normalize(path)):
        raise Forbidden(f"token {token.name!r} does not cover file {file_id}",
                        token=token.id, file_id=file_id)
    authorize(request, op, path)


async def _paths(service: MetaService, req: CapabilityRequest) -> list[str | StagerError]:
    """Where each file of ``req`` is: an upload's path for a write, a committed file's
    for a read; an error in its place when there is none."""
    if req.op == "write":
        return [u.path if isinstance(u, Upload) else u
                for u in await service.store.get_uploads(list(req.file_ids))]
    out: list[str | StagerError] = []
    for file_id in req.file_ids:
        path = await service.store.path_of_file(file_id)
        out.append(path if path is not None else NotFound(f"no file {file_id}",
                                                          file_id=file_id))
    return out


def handlers(service: MetaService, config: Config) -> dict[str, object]:
    async def capabilities_route(request: web.Request) -> web.Response:
        return await capabilities(request, service, config.max_json_body)

    return {"auth_key": auth_key, "create_token": create_token, "list_tokens": list_tokens,
            "revoke_token": revoke_token, "capabilities": capabilities_route}
