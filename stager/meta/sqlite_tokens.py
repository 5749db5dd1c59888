"""The SQL of minted tokens: what ``stager token list`` shows and revocation reads.

A token's text is never stored: whoever holds the signing key can mint it again,
and whoever reads the database must not be able to use it.  Revocation is a
timestamp on the record, so a revoked token still lists, with when.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import NotFound
from ..protocol.authmsg import TokenInfo
from .sqlite_db import Database

_COLS = "id, name, scopes, prefixes, created, expires, revoked"


def _info(row: tuple[Any, ...]) -> TokenInfo:
    token_id, name, scopes, prefixes, created, expires, revoked = row
    return TokenInfo(str(token_id), str(name), tuple(json.loads(scopes)),
                     tuple(json.loads(prefixes)), int(created), int(expires),
                     None if revoked is None else int(revoked))


class TokenSQL:
    def __init__(self, database: Database) -> None:
        self.db = database.db

    def put(self, info: TokenInfo) -> None:
        self.db.execute(f"INSERT INTO tokens ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (info.id, info.name, json.dumps(list(info.scopes)),
                         json.dumps(list(info.prefixes)), info.created, info.expires,
                         info.revoked))

    def list(self) -> list[TokenInfo]:
        rows = self.db.execute(f"SELECT {_COLS} FROM tokens ORDER BY created, id").fetchall()
        return [_info(r) for r in rows]

    def revoke(self, token_id: str, now: int) -> TokenInfo:
        self.db.execute("UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL",
                        (now, token_id))
        row = self.db.execute(f"SELECT {_COLS} FROM tokens WHERE id = ?",
                              (token_id,)).fetchone()
        if row is None:
            raise NotFound(f"no token {token_id}", token=token_id)
        return _info(row)
