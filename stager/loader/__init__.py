"""The loader: deterministic sharded order, exact elastic resume, prefetch, telemetry.

``Loader`` is the entry point; the policies it uses are registered by name in
``ORDERS`` (:mod:`.order`), ``PARTITIONS`` and ``WORKER_SPLITS``
(:mod:`.partition`) and the formats in ``FORMATS`` (:mod:`.formats`).  Nothing
here imports torch; :mod:`stager.torch` adapts the loader to PyTorch.
"""

from .fetch import FetchOptions
from .formats import FORMATS
from .loader import Loader
from .order import ORDERS, shuffle_quality
from .partition import PARTITIONS, WORKER_SPLITS

__all__ = ["FORMATS", "ORDERS", "PARTITIONS", "WORKER_SPLITS", "FetchOptions", "Loader",
           "shuffle_quality"]
