"""The client library: ``AsyncClient`` (the core) and ``Client`` (its blocking twin)."""

from .async_client import AsyncClient
from .bulk import WriteItem
from .fileio import AsyncReadFile, AsyncWriteFile
from .sync import Client, SyncReadFile, SyncWriteFile

__all__ = ["AsyncClient", "AsyncReadFile", "AsyncWriteFile", "Client", "SyncReadFile",
           "SyncWriteFile", "WriteItem"]
