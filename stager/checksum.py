"""CRC32C, the one checksum stager stores and verifies (hardware-accelerated)."""

from __future__ import annotations

import crc32c as _crc32c


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value``."""
    return int(_crc32c.crc32c(data, value))


def to_hex(value: int) -> str:
    return f"{value:08x}"


def from_hex(text: str) -> int:
    if len(text) != 8:
        raise ValueError(f"not a CRC32C: {text!r}")
    return int(text, 16)
