"""Chunk storage on a local directory (a storage target)."""

from .chunkstore import ChunkStore, OpenChunk, Usage

__all__ = ["ChunkStore", "OpenChunk", "Usage"]
