"""Chunk storage on a local directory (a storage target)."""

from .chunkfile import ChunkMeta
from .chunkstore import ChunkStore, OpenChunk, StoredChunk, Usage

__all__ = ["ChunkMeta", "ChunkStore", "OpenChunk", "StoredChunk", "Usage"]
