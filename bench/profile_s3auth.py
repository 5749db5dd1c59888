"""What S3 Signature V4 costs the gateway per request, without the S3 handlers: one
request's :meth:`~stager.s3.auth.Authenticator.authenticate` when the key's answer is
remembered (parse, canonical request, time, one HMAC) and when the metadata server is
asked (``s3key_verify``, over loopback HTTP, to a real metadata server with auth on).

    python -m bench.profile_s3auth [N]        # N requests each way (default 2000)

One process; wall time per call, median of N.  A presigned URL and a header-signed
GET cost the same here: both are one parse and one HMAC.
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


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        cluster = ThreadCluster(Path(tmp), 1, auth=True)
        cluster.start()
        try:
            asyncio.run(main(count, cluster.meta_url, cluster.admin_token))
        finally:
            cluster.stop()
