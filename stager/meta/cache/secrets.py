"""A source's storage options (keys, secrets, endpoints) encrypted at rest.

An attachment's options are needed by whichever metadata server fills a chunk, and
by nobody else: they are stored in the shared store sealed with a key kept next
to the signing key (``AUTH_DIR/source.key``, 0600; metadata servers that share a
store share that directory, as they share the signing key), and never sent back.
The sealing itself is :class:`~stager.auth.sealed.SealedBox`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from ...auth.sealed import SealedBox

KEY_FILE = "source.key"


class OptionsBox(SealedBox):
    """Seals and opens storage options with the key in ``source.key``."""

    @classmethod
    def under(cls, directory: Path | str, key_file: str = KEY_FILE) -> Self:
        return super().under(directory, key_file)
