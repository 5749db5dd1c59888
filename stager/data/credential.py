"""A data server's word toward the metadata server: its target's own credential.

A data server with auth joins with a token of the ``join`` scope, which every
storage node holds.  At its target's first registration the metadata server
answers the target's own credential (stager/meta/targetauth.py); it is kept here,
``ROOT/target.credential`` (0600), and presented for everything the server says
from then on: registering again, heartbeats, leaving, scrub reports.  The join
token is shown again only when there is no credential, or when the metadata server
refused the one kept (revoked by an operator, to rotate it): then the file is
dropped and the server registers anew.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from ..auth.keys import write_secret
from ..config import Config

log = logging.getLogger("stager.data")
CREDENTIAL_FILE = "target.credential"


class TargetCredential:
    """The credential under ``root``, else the configured (join) token."""

    def __init__(self, root: Path, config: Config) -> None:
        self.path = root / CREDENTIAL_FILE
        self.config = config
        self.text: str | None = None
        if config.auth and self.path.exists():
            self.text = self.path.read_text().strip() or None

    @property
    def held(self) -> bool:
        return self.text is not None

    def headers(self) -> dict[str, str]:
        """``Authorization`` with the credential, or with the join token."""
        if self.text is not None:
            return {"Authorization": f"Bearer {self.text}"}
        return self.config.auth_headers()

    def keep(self, text: str) -> None:
        """Keep the credential the metadata server minted (replacing one it refused)."""
        self.drop()
        write_secret(self.path, text + "\n")
        self.text = text
        log.info("keeping this target's credential in %s (mode 0600)", self.path)

    def drop(self) -> None:
        """The metadata server refused the credential: back to the join token."""
        if self.text is not None:
            log.warning("the metadata server refused this target's credential (revoked?): "
                        "registering again with the join token")
        self.text = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
