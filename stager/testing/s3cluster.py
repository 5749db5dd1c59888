"""S3 endpoints for tests: a real ``stager up --s3-port 0`` cluster, or the gateway app
in a thread over any cluster, and a path-style boto3 client for either.

``S3Cluster`` is what client tests use (boto3, the AWS CLI, s3fs, pyarrow, DuckDB,
rclone)::

    with S3Cluster(tmp_path) as s3:
        c = boto3_client(s3.url)      # s3.access_key / s3.secret_key: any on an open cluster
        c.create_bucket(Bucket="b")
        ...                           # s3.meta_url for stager's own clients

``S3Thread`` serves the gateway app (:func:`stager.s3.app.make_s3_app`) on
``127.0.0.1:0`` in a thread of its own, over a cluster's ``meta_url``: quick, for
in-process tests that send raw requests.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import load_config
from .cluster import ProcessCluster

ACCESS_KEY = "stager-test-key"
SECRET_KEY = "stager-test-secret"
REGION = "us-east-1"


class S3Cluster:
    """``stager up --s3-port 0`` in a subprocess (a :class:`ProcessCluster`)."""

    def __init__(self, root: str | os.PathLike[str], data_servers: int = 2,
                 up_args: Sequence[str] = (), **kwargs: Any) -> None:
        self.cluster = ProcessCluster(root, data_servers=data_servers,
                                      up_args=["--s3-port", "0", *up_args], **kwargs)
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION

    def __enter__(self) -> S3Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.cluster.start()
        if "s3_url" not in self.cluster.info:
            self.cluster.stop()
            raise RuntimeError("stager up --s3-port wrote no s3_url to cluster.json")

    def stop(self) -> None:
        self.cluster.stop()

    @property
    def url(self) -> str:
        """The S3 endpoint (``http://127.0.0.1:PORT``)."""
        return str(self.cluster.info["s3_url"])

    @property
    def meta_url(self) -> str:
        return self.cluster.meta_url

    @property
    def cluster_dir(self) -> Path:
        return self.cluster.root

    @property
    def ca_file(self) -> str:
        """With ``tls=True`` (``stager up --tls``): the CA of the endpoint's certificate."""
        return self.cluster.ca_file

    @property
    def host_port(self) -> str:
        """``HOST:PORT`` of the endpoint (pyarrow's ``endpoint_override``, DuckDB's
        ``ENDPOINT``)."""
        return self.url.split("://", 1)[1]


class S3Thread:
    """The gateway app on ``127.0.0.1:0`` in a thread, over the cluster at ``meta_url``."""

    def __init__(self, meta_url: str, *, domain: str = "", **overrides: Any) -> None:
        self.meta_url = meta_url
        self.domain = domain
        self.config = load_config({"host": "127.0.0.1", "port": 0, **overrides}, env={})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stager-s3",
                                       daemon=True)
        self.url = ""
        self.access_key, self.secret_key = ACCESS_KEY, SECRET_KEY
        self._runner: Any = None

    def __enter__(self) -> S3Thread:
        from aiohttp import web

        from ..s3.app import make_s3_app
        from ..web.parseerrors import Runner

        async def start() -> str:
            app = make_s3_app(self.meta_url, self.config, domain=self.domain)
            self._runner = Runner(app, access_log=None)    # parse errors as S3 XML too
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = self._runner.addresses[0][1]
            return f"http://127.0.0.1:{port}"

        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def boto3_client(endpoint: str, *, access_key: str = ACCESS_KEY,
                 secret_key: str = SECRET_KEY, verify: str | bool | None = None,
                 **config: Any) -> Any:
    """A boto3 S3 client for ``endpoint``, path-style, us-east-1, with the installed
    boto3's default checksums; ``verify``: the CA file of an ``https://`` endpoint;
    ``config``: more ``botocore.config.Config`` settings."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name=REGION, verify=verify,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 2, "mode": "standard"},
                                      **config))


def error_of(raised: Any) -> tuple[str, int]:
    """The S3 error code and HTTP status of a botocore ``ClientError`` (or of pytest's
    ``ExceptionInfo`` holding one)."""
    response = getattr(raised, "value", raised).response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]
