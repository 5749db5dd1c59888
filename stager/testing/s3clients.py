"""The S3 clients people use, each configured for one S3 endpoint on loopback.

Every client here is a real, unmodified one (boto3, the AWS CLI, s3fs, Arrow's
C++ ``S3FileSystem``, DuckDB's httpfs, polars' object_store, rclone); what
differs between them is only how each is told the endpoint, path-style
addressing, the region and the credentials, and each has its trap (DuckDB
cannot download its extension here, the CLIs read the machine's AWS settings,
Arrow wants ``HOST:PORT`` without a scheme).  One :class:`S3Endpoint` holds the
endpoint and makes every client from it, so the test modules say only what they
do with a client, and :func:`moto_endpoint` makes the same clients on moto's S3
server, the reference a failure against stager's endpoint is compared with.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REGION = "us-east-1"


class ClientMissing(RuntimeError):
    """A client the dev extra or ``make sysdeps`` installs is not on this machine."""


def _bin_dir() -> Path:
    """The running venv's scripts folder (not the machine's PATH: a pyenv shim or
    a system ``aws`` there would be another version with other settings)."""
    return Path(sys.executable).parent


def aws_cli() -> str:
    """The AWS CLI (v1, the dev extra's ``awscli``) of this venv."""
    path = _bin_dir() / "aws"
    if not path.exists():
        raise ClientMissing(f"no {path}: install the dev extra (awscli)")
    return str(path)


def rclone() -> str:
    """Debian's rclone (``make sysdeps``)."""
    path = shutil.which("rclone")
    if path is None:
        raise ClientMissing("no rclone on PATH: make sysdeps installs Debian's rclone")
    return path


def httpfs_extension() -> Path:
    """The httpfs extension file that ``duckdb-ext-httpfs`` installs for the installed
    DuckDB (``duckdb_ext/extensions/vX.Y.Z/PLATFORM/``): DuckDB cannot download it
    here, so it is LOADed by path."""
    import duckdb

    version = f"v{duckdb.__version__}"
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for root in dict.fromkeys(roots):
        folder = Path(root) / "duckdb_ext" / "extensions" / version
        found = sorted(folder.glob("*/httpfs.duckdb_extension"))
        if found:
            return found[0]
    raise ClientMissing(f"no httpfs.duckdb_extension for DuckDB {version}: install the dev "
                        "extra's duckdb-ext-httpfs of the same version as duckdb")


def machine_free_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (the process's environment) without any AWS or rclone setting of the
    machine's, and never the instance metadata service."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("AWS_", "RCLONE_"))}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_DEFAULT_REGION=REGION,
               RCLONE_CONFIG="/nonexistent")
    return env


@dataclass(frozen=True)
class S3Endpoint:
    """An S3 endpoint (``http://HOST:PORT``, path-style) and the credentials to use."""

    url: str
    access_key: str
    secret_key: str
    region: str = REGION

    @property
    def host_port(self) -> str:
        """``HOST:PORT``, as Arrow and DuckDB take the endpoint."""
        return urlsplit(self.url).netloc

    # -- Python clients ----------------------------------------------------------
    def boto3(self, **config: Any) -> Any:
        """A boto3 S3 client (path-style; the installed boto3's default checksums)."""
        from .s3cluster import boto3_client

        return boto3_client(self.url, access_key=self.access_key, secret_key=self.secret_key,
                            **config)

    def s3fs_options(self) -> dict[str, Any]:
        """Storage options for ``s3://`` through fsspec (s3fs, aiobotocore)."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.url, "region_name": self.region},
                "config_kwargs": {"s3": {"addressing_style": "path"}}}

    def s3fs(self) -> Any:
        """An s3fs filesystem on the endpoint, not the instance cache's (each test its own)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.s3fs_options())

    def pyarrow(self) -> Any:
        """Arrow's C++ S3 client (``pyarrow.fs.S3FileSystem``), path-style over http.
        The AWS SDK reads ``AWS_REQUEST_CHECKSUM_CALCULATION`` here, when the client
        is made (``when_required``: no checksum on uploads; unset: CRC64NVME)."""
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.host_port, scheme="http",
                               access_key=self.access_key, secret_key=self.secret_key,
                               region=self.region, force_virtual_addressing=False)

    def duckdb(self) -> Any:
        """An in-memory DuckDB connection with httpfs LOADed from its package's file
        and an S3 secret for the endpoint."""
        import duckdb

        con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                     "autoload_known_extensions": False})
        con.execute(f"LOAD '{httpfs_extension()}'")
        con.execute(f"CREATE SECRET stager_s3 (TYPE S3, KEY_ID {_sql(self.access_key)}, "
                    f"SECRET {_sql(self.secret_key)}, ENDPOINT {_sql(self.host_port)}, "
                    f"URL_STYLE 'path', USE_SSL false, REGION {_sql(self.region)})")
        return con

    def polars_options(self, checksum: str | None = None) -> dict[str, str]:
        """``storage_options`` for polars' ``scan_parquet``/``write_parquet`` on s3://;
        ``checksum``: the one uploads carry (object_store takes ``sha256``), None its
        default (CRC64NVME)."""
        options = {"aws_endpoint_url": self.url, "aws_access_key_id": self.access_key,
                   "aws_secret_access_key": self.secret_key, "aws_region": self.region,
                   "aws_allow_http": "true", "aws_virtual_hosted_style_request": "false"}
        if checksum is not None:
            options["aws_checksum_algorithm"] = checksum
        return options

    # -- command-line clients ----------------------------------------------------
    def aws_env(self) -> dict[str, str]:
        """The environment for ``aws``: these credentials and nothing of the machine's."""
        env = machine_free_env()
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key,
                   AWS_DEFAULT_REGION=self.region)
        return env

    def aws(self, *args: str, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``aws --endpoint-url URL ARGS…`` (path-style is the CLI's default for an
        endpoint URL with a port)."""
        return _run([aws_cli(), "--endpoint-url", self.url, *args], self.aws_env(),
                    timeout, check)

    def rclone_env(self, remote: str = "st") -> dict[str, str]:
        """An rclone remote named ``remote`` from the environment alone (no config file)."""
        prefix = f"RCLONE_CONFIG_{remote.upper()}_"
        env = machine_free_env()
        env.update({prefix + "TYPE": "s3", prefix + "PROVIDER": "Other",
                    prefix + "ENDPOINT": self.url, prefix + "ACCESS_KEY_ID": self.access_key,
                    prefix + "SECRET_ACCESS_KEY": self.secret_key,
                    prefix + "REGION": self.region, prefix + "FORCE_PATH_STYLE": "true"})
        return env

    def rclone(self, *args: str, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``rclone ARGS…`` with the remote ``st:`` naming this endpoint."""
        return _run([rclone(), *args], self.rclone_env(), timeout, check)


def _sql(text: str) -> str:
    """A SQL string literal (CREATE SECRET takes no bound parameters)."""
    return "'" + text.replace("'", "''") + "'"


def _run(argv: Sequence[str], env: dict[str, str], timeout: float,
         check: bool) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}\n"
                             f"stdout: {done.stdout[-4000:]}\nstderr: {done.stderr[-4000:]}")
    return done


@dataclass
class S3Stack:
    """A real cluster with its S3 gateway (``stager up --s3-port 0``), one bucket on it,
    and ``stager://`` on the same cluster: what a client writes through S3 is read back
    through ``fs`` and the other way round."""

    endpoint: S3Endpoint
    fs: Any                      # stager.fs.StagerFileSystem on the cluster's metadata server
    bucket: str
    cluster: Any                 # stager.testing.s3cluster.S3Cluster

    def path(self, key: str) -> str:
        """The stager path of ``key`` in the bucket: a bucket is a top-level directory."""
        return f"/{self.bucket}/{key}"

    def url(self, key: str) -> str:
        """``s3://BUCKET/KEY``."""
        return f"s3://{self.bucket}/{key}"

    def stager_url(self, key: str) -> str:
        """``stager://HOST:PORT/BUCKET/KEY``: the same object through fsspec's ``stager``."""
        return f"stager://{urlsplit(self.cluster.meta_url).netloc}{self.path(key)}"

    def put_tree(self, prefix: str, files: dict[str, bytes]) -> None:
        """Writes ``files`` (relative name -> bytes) under ``prefix`` through stager."""
        for name, data in files.items():
            self.fs.pipe_file(self.path(f"{prefix}/{name}"), data)

    def read_tree(self, prefix: str) -> dict[str, bytes]:
        """Every file under ``prefix`` read through stager (relative name -> bytes)."""
        root = self.path(prefix)
        return {p.removeprefix(root + "/").lstrip("/"): self.fs.cat_file(p)
                for p in self.fs.find(root)}


@contextmanager
def s3_stack(root: Path, bucket: str) -> Iterator[S3Stack]:
    """Starts ``stager up --s3-port 0`` under ``root`` and makes ``bucket`` on it with
    CreateBucket (boto3)."""
    import fsspec

    from .s3cluster import S3Cluster

    with S3Cluster(root) as cluster:
        endpoint = S3Endpoint(cluster.url, cluster.access_key, cluster.secret_key)
        api = endpoint.boto3()
        api.create_bucket(Bucket=bucket)
        api.close()
        fs = fsspec.filesystem("stager", meta_url=cluster.meta_url, skip_instance_cache=True)
        try:
            yield S3Stack(endpoint, fs, bucket, cluster)
        finally:
            fs.close()


def make_tree(seed: int, count: int = 12) -> dict[str, bytes]:
    """Files in nested folders, of sizes from empty to a few hundred KiB (one
    deterministic tree per seed)."""
    import random

    rng = random.Random(seed)
    sizes = [0, 1, 4095, 4096, 65537, 300_001] + [rng.randrange(1, 200_000)
                                                  for _ in range(max(0, count - 6))]
    folders = ["", "a/", "a/b/", "c/", "c/d/e/"]
    return {f"{folders[i % len(folders)]}f{i:02d}.bin": rng.randbytes(size)
            for i, size in enumerate(sizes)}


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    """Writes ``files`` under the local folder ``root``; returns ``root``."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def read_dir(root: Path) -> dict[str, bytes]:
    """Every file under the local folder ``root`` (relative name -> bytes)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@contextmanager
def moto_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on 127.0.0.1:0, the reference endpoint (any credentials)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Endpoint(f"http://{host}:{port}", "moto-key", "moto-secret")
    finally:
        stop_moto(server)


def stop_moto(server: Any) -> None:
    """Stop a ``ThreadedMotoServer`` and close its socket: its ``stop()`` leaves the
    listening socket open, and only its private server object can close it (here, once)."""
    server.stop()
    server._server.server_close()
