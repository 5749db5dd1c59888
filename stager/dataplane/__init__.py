"""The data path shared by the client and the gateway: chunk transport, striped reads and writes."""

from .reader import StripedReader
from .transport import DataPlane, PlaneOptions, TargetCounters, make_session
from .writer import StripedWriter

__all__ = ["DataPlane", "PlaneOptions", "StripedReader", "StripedWriter", "TargetCounters",
           "make_session"]
