"""The loader: deterministic sharded order, exact elastic resume, prefetch, telemetry.

``Loader`` is the entry point; the policies it uses are registered by name in
``ORDERS`` (:mod:`stager.plans.order`), ``PARTITIONS`` and ``WORKER_SPLITS``
(:mod:`stager.plans.partition`) and the formats in ``FORMATS`` (:mod:`.formats`).  Nothing
here imports torch; :mod:`stager.torch` adapts the loader to PyTorch.
"""

from ..plans.order import ORDERS, shuffle_quality
from ..plans.partition import PARTITIONS, WORKER_SPLITS
from .fetch import FetchOptions
from .formats import FORMATS
from .loader import Loader

__all__ = ["FORMATS", "ORDERS", "PARTITIONS", "WORKER_SPLITS", "FetchOptions", "Loader",
           "shuffle_quality"]
