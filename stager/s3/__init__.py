"""An S3-compatible endpoint over a stager cluster (``stager s3``).

The gateway is a client of the cluster, like ``stager.fs``: it reads and writes through
``stager.client`` and the read and write engines; no server imports it. A bucket is a
top-level directory of the namespace (``s3://datasets/x`` is ``/datasets/x``).
"""
