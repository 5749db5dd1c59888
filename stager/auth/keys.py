"""The metadata server's Ed25519 signing key: made once, kept private, loaded back.

The key signs every token and capability, so it lives in one file,
``ROOT/auth/signing.key`` (PKCS#8 PEM, which ``openssl pkey`` reads too), mode
0600 in a 0700 directory.  It is written the durable way (temporary file, fsync,
hard link into place, fsync of the directory): a crash leaves either no key or a
whole one, and two servers starting at once cannot each write their own — the
second finds the first's key and uses it.  Regenerating the key would
invalidate every token handed out, so :func:`load_or_create_key` only ever
creates a key where there is none.

A key file that group or others may read is refused, as ssh refuses such a
private key: whoever can read it can mint an admin token.  These are
configuration errors met at start-up, so they are the built-ins the CLI already
prints as one line (:class:`PermissionError`, :class:`ValueError`).

The public half travels as text: the 32 raw bytes, base64url without padding
(43 characters), for data servers' configuration and ``cluster.json``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..aio import fsync_dir
from . import b64

KEY_FILE = "signing.key"
PUBLIC_KEY_BYTES = 32


def load_or_create_key(directory: Path | str) -> Ed25519PrivateKey:
    """The key in ``directory/signing.key``, made first if there is none."""
    path = Path(directory) / KEY_FILE
    try:
        return load_key(path)
    except FileNotFoundError:
        pass
    try:
        return generate_key(path)
    except FileExistsError:         # another process made it between our two looks
        return load_key(path)


def generate_key(path: Path | str) -> Ed25519PrivateKey:
    """Make a new key and store it at ``path``; never replaces an existing file."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    write_secret(path, key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return key


def write_secret(path: Path | str, data: bytes | str) -> None:
    """Write ``data`` to a new file at ``path``, mode 0600 from its first byte, durably
    (a temporary file, fsync, a hard link into place, fsync of the directory);
    :class:`FileExistsError` when ``path`` exists: a secret is never replaced."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)          # unlike rename, refuses to replace a file already there
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def load_key(path: Path | str) -> Ed25519PrivateKey:
    """The key stored at ``path``; refuses a file group or others may read."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077:
            raise PermissionError(f"signing key {path} is open to group or others "
                                  f"(mode {mode:04o}); run: chmod 600 {path}")
        pem = f.read()
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(f"signing key {path} is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"signing key {path} is not an Ed25519 key")
    return key


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as 43 base64url characters, for data servers and ``cluster.json``."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return b64.encode(public.public_bytes(serialization.Encoding.Raw,
                                          serialization.PublicFormat.Raw))


def load_public_key(text: str) -> Ed25519PublicKey:
    """The public key written by :func:`public_key_text`; a clear error for anything else."""
    try:
        raw = b64.decode(text.strip() if isinstance(text, str) else text)
    except ValueError:
        raw = b""
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError("the auth public key must be 43 base64url characters "
                         "(32 raw Ed25519 bytes), as `stager meta --auth` writes it")
    return Ed25519PublicKey.from_public_bytes(raw)
