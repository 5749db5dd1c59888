"""The SQL of minted tokens: what ``stager token list`` shows and revocation reads.

A token's text is never stored: whoever holds the signing key can mint it again,
and whoever reads the database must not be able to use it.  Revocation is a
timestamp on the record, so a revoked token still lists, with when.  A join token
may have a number of uses left; each target credential's id is pinned to its target.
"""

from __future__ import annotations

import json
from typing import Any

from ....errors import NotFound
from ....protocol.authmsg import TokenInfo
from .db import Database

_COLS = "id, name, scopes, prefixes, created, expires, revoked, uses"


def _info(row: tuple[Any, ...]) -> TokenInfo:
    token_id, name, scopes, prefixes, created, expires, revoked, uses = row
    return TokenInfo(str(token_id), str(name), tuple(json.loads(scopes)),
                     tuple(json.loads(prefixes)), int(created), int(expires),
                     None if revoked is None else int(revoked),
                     None if uses is None else int(uses))


class TokenSQL:
    def __init__(self, database: Database) -> None:
        self.db = database.db

    def put(self, info: TokenInfo) -> None:
        self.db.execute(f"INSERT INTO tokens ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (info.id, info.name, json.dumps(list(info.scopes)),
                         json.dumps(list(info.prefixes)), info.created, info.expires,
                         info.revoked, info.uses))

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

    def take_use(self, token_id: str) -> bool:
        row = self.db.execute(
            "UPDATE tokens SET uses = uses - 1 WHERE id = ? AND uses > 0 RETURNING uses",
            (token_id,)).fetchone()
        if row is not None:
            return True
        row = self.db.execute("SELECT uses FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return row is not None and row[0] is None

    def pinned(self, target_id: str) -> str | None:
        row = self.db.execute("SELECT token_id FROM target_credentials WHERE target_id = ?",
                              (target_id,)).fetchone()
        return None if row is None else str(row[0])

    def pin(self, target_id: str, token_id: str, replaces: str | None) -> bool:
        if replaces is None:
            cur = self.db.execute("INSERT OR IGNORE INTO target_credentials VALUES (?, ?)",
                                  (target_id, token_id))
        else:
            cur = self.db.execute("UPDATE target_credentials SET token_id = ? "
                                  "WHERE target_id = ? AND token_id = ?",
                                  (token_id, target_id, replaces))
        return cur.rowcount == 1

    def forget_target(self, target_id: str) -> None:
        self.db.execute("DELETE FROM target_credentials WHERE target_id = ?", (target_id,))
        self.db.execute("DELETE FROM targets WHERE id = ?", (target_id,))
