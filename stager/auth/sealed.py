"""Secrets kept at rest in a store that must not be able to leak them: sealed.

A :class:`SealedBox` encrypts a small JSON object with one Fernet key (AES-128-CBC
and HMAC-SHA256: a sealed value that was changed does not open) kept in a file of
the auth directory, 0600, beside the signing key.  Metadata servers that share a
store share that directory, as they share the signing key; whoever copies the
database alone opens nothing.  Each kind of secret has a key file of its own:
a source's storage options (``source.key``, stager/meta/cache/secrets.py), S3
secrets and the tokens they stand for (``s3.key``, stager/meta/s3keys.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from cryptography.fernet import Fernet, InvalidToken

from ..errors import InternalError
from .keys import write_secret


class SealedBox:
    """Seals and opens JSON objects with the key in one file."""

    def __init__(self, key: bytes, *, name: str = "the key") -> None:
        self._fernet = Fernet(key)
        self.name = name

    @classmethod
    def under(cls, directory: Path | str, key_file: str) -> Self:
        """The key in ``directory/key_file``, made first if there is none."""
        path = Path(directory) / key_file
        try:
            write_secret(path, Fernet.generate_key())
        except FileExistsError:         # made before (or by another server meanwhile)
            pass
        return cls(path.read_bytes().strip(), name=key_file)

    def seal(self, value: dict[str, Any]) -> bytes:
        return self._fernet.encrypt(json.dumps(value, sort_keys=True).encode())

    def open(self, sealed: bytes) -> dict[str, Any]:
        try:
            return dict(json.loads(self._fernet.decrypt(sealed)))
        except InvalidToken:
            raise InternalError(f"a secret was sealed with another key: metadata servers "
                                f"sharing a store must share their auth directory's "
                                f"{self.name}") from None
