"""Chunk storage on a local directory (a storage target)."""

from .chunkstore import ChunkStore, OpenChunk, StoredChunk, Usage

__all__ = ["ChunkStore", "OpenChunk", "StoredChunk", "Usage"]
