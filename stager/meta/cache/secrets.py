"""A source's storage options (keys, secrets, endpoints) encrypted at rest.

An attachment's options are needed by whichever metadata server fills a chunk, and
by nobody else: they are stored in the shared store encrypted with a key kept next
to the signing key (``AUTH_DIR/source.key``, 0600; metadata servers that share a
store share that directory, as they share the signing key), and never sent back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from ...auth.keys import write_secret
from ...errors import InternalError

KEY_FILE = "source.key"


class OptionsBox:
    """Seals and opens storage options with one Fernet key (AES-128-CBC + HMAC)."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def under(cls, directory: Path | str) -> OptionsBox:
        """The key in ``directory/source.key``, made first if there is none."""
        path = Path(directory) / KEY_FILE
        try:
            write_secret(path, Fernet.generate_key())
        except FileExistsError:         # made before (or by another server meanwhile)
            pass
        return cls(path.read_bytes().strip())

    def seal(self, options: dict[str, Any]) -> bytes:
        return self._fernet.encrypt(json.dumps(options, sort_keys=True).encode())

    def open(self, sealed: bytes) -> dict[str, Any]:
        try:
            return dict(json.loads(self._fernet.decrypt(sealed)))
        except InvalidToken:
            raise InternalError("the source's storage options were sealed with another key: "
                                "metadata servers sharing a store must share "
                                f"their auth directory's {KEY_FILE}") from None
