"""The store's S3 key role: each S3 access key and the stager token it stands for.

A key's secret and its token's text are needed by the metadata server that checks a
signature, and by nobody else: a record keeps them sealed (``sealed``: encrypted
with the auth directory's key, :class:`~stager.auth.sealed.SealedBox`), never in
clear text, so a copy of the database alone signs nothing.  The token id is kept
in clear: revocation and ``stager token list`` need it.  One of the roles
:class:`~stager.meta.store.base.MetaStore` joins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class S3KeyRecord:
    """An S3 access key bound to the stager token ``token_id``."""

    access_key: str
    token_id: str
    sealed: bytes                   # {"secret", "token"}, sealed
    created: int                    # unix seconds


class S3Keys(ABC):
    """S3 access keys (:mod:`stager.meta.s3keys`)."""

    @abstractmethod
    async def put_s3_keys(self, records: Sequence[S3KeyRecord]) -> None:
        """Record new keys (an access key already recorded is an
        :class:`~stager.errors.AlreadyExists`, and none of the batch is kept)."""

    @abstractmethod
    async def find_s3_keys(self, access_keys: Sequence[str]) -> dict[str, S3KeyRecord]:
        """The records of those of ``access_keys`` that exist, by access key."""

    @abstractmethod
    async def list_s3_keys(self) -> list[S3KeyRecord]:
        """Every key, oldest first."""
