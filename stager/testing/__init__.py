"""Helpers for tests and benchmarks that need a real cluster."""

from .cluster import ProcessCluster, ThreadCluster, wait_for_targets

__all__ = ["ProcessCluster", "ThreadCluster", "wait_for_targets"]
