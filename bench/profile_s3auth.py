"""What S3 Signature V4 costs the gateway per request, without the S3 handlers: one
request's :meth:`~stager.s3.auth.Authenticator.authenticate` when the key's answer is
remembered (parse, canonical request, time, one HMAC) and when the metadata server is
asked (``s3key_verify``, over loopback HTTP, to a real metadata server with auth on).

    python -m bench.profile_s3auth [N]        # N requests each way (default 2000)
    python -m bench.profile_s3auth e2e [N]    # boto3 GETs of 16 KiB, --auth or not

One process; wall time per call, median of N.  A presigned URL and a header-signed
GET cost the same here: both are one parse and one HMAC.  ``e2e``: N GETs of one
16 KiB object, one after another, through ``stager up --s3-port`` with and without
``--auth`` (boto3, a key for the bucket): what signature checks add to a small read.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp.test_utils import make_mocked_request
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from stager import AsyncClient
from stager.s3.auth import Authenticator
from stager.testing import ThreadCluster


def signed_headers(key: str, secret: str) -> dict[str, str]:
    request = AWSRequest("GET", "http://127.0.0.1:9000/datasets/a/x.bin?partNumber=1",
                         headers={"Range": "bytes=0-99"})
    S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
    return {"Host": "127.0.0.1:9000", **dict(request.headers.items())}


async def timed(auth: Authenticator, headers: dict[str, str], n: int, *,
                forget: bool) -> list[float]:
    out = []
    for _ in range(n):
        if forget:
            auth.forget()               # every call asks the metadata server
        request = make_mocked_request("GET", "/datasets/a/x.bin?partNumber=1", headers=headers)
        t = time.perf_counter()
        await auth.authenticate(request)
        out.append(time.perf_counter() - t)
    return out


async def main(n: int, meta_url: str, admin: str) -> None:
    async with AsyncClient(meta_url, token=admin) as c:
        made = await c.create_s3_key(["read"], ["/datasets"], 3600, "profile")
        gateway = (await c.create_token(["s3gateway"], ["/"], 3600, "profile gw")).token
    from stager.config import load_config
    auth = Authenticator(required=True, meta_url=meta_url,
                         config=load_config({"token": gateway}, env={}))
    headers = signed_headers(made.access_key, made.secret_key)
    try:
        asked = await timed(auth, headers, n, forget=True)
        known = await timed(auth, headers, n, forget=False)
    finally:
        await auth.close()
    print(f"authenticate, answer remembered: median {statistics.median(known) * 1e6:.0f} us"
          f", p99 {sorted(known)[int(n * 0.99)] * 1e6:.0f} us  ({n} calls)")
    print(f"authenticate, metadata server asked: median {statistics.median(asked) * 1e6:.0f}"
          f" us, p99 {sorted(asked)[int(n * 0.99)] * 1e6:.0f} us  ({n} calls, "
          f"{auth.asked} questions)")


def e2e(n: int) -> None:
    from stager.testing.s3cluster import S3Cluster, boto3_client

    for auth in (False, True):
        with tempfile.TemporaryDirectory() as tmp, S3Cluster(tmp, auth=auth) as s3:
            key, secret = s3.access_key, s3.secret_key
            if auth:
                async def mint() -> tuple[str, str]:
                    async with AsyncClient(s3.meta_url, token=s3.cluster.admin_token) as c:
                        made = await c.create_s3_key(["read", "write"], ["/"], 3600, "e2e")
                        return made.access_key, made.secret_key
                key, secret = asyncio.run(mint())
            c = boto3_client(s3.url, access_key=key, secret_key=secret)
            c.create_bucket(Bucket="bench")
            c.put_object(Bucket="bench", Key="k", Body=b"x" * 16384)
            times = []
            for _ in range(n):
                t = time.perf_counter()
                c.get_object(Bucket="bench", Key="k")["Body"].read()
                times.append(time.perf_counter() - t)
            print(f"boto3 GET 16 KiB, auth {'on ' if auth else 'off'}: median "
                  f"{statistics.median(times) * 1e3:.2f} ms, {n / sum(times):.0f} GETs/s "
                  f"({n} one after another)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["e2e"]:
        e2e(int(sys.argv[2]) if len(sys.argv) > 2 else 500)
        raise SystemExit(0)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        cluster = ThreadCluster(Path(tmp), 1, auth=True)
        cluster.start()
        try:
            asyncio.run(main(count, cluster.meta_url, cluster.admin_token))
        finally:
            cluster.stop()
