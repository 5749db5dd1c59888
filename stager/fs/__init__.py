"""The ``stager://`` fsspec filesystem (registered through the ``fsspec.specs`` entry point)."""

from .files import StagerReadFile, StagerWriteFile
from .filesystem import StagerFileSystem

__all__ = ["StagerFileSystem", "StagerReadFile", "StagerWriteFile"]
