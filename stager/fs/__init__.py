"""The ``stager://`` fsspec filesystem (registered through the ``fsspec.specs`` entry point)."""

from .buffered import StagerReadFile, StagerWriteFile
from .filesystem import StagerFileSystem

__all__ = ["StagerFileSystem", "StagerReadFile", "StagerWriteFile"]
