"""Generated requests against every server, from the ``/openapi.json`` it serves (issue 18).

schemathesis builds requests for every operation of each server's own document:
valid ones (the document states the bounds and patterns the parsers check, so
these reach the services) and knowingly invalid ones.  Whatever comes, no answer
may be a server error, and every error is the JSON error shape.  hypothesis runs
derandomized, so CI sends the same requests every run.

The operations are parametrized from the route table, so none is forgotten, and
each test draws its cases from ``operation.as_strategy()``.  schemathesis's own
pytest loader (``schemathesis.pytest.from_fixture``) cannot be used: it sets
``request.node._nodeid``, which pytest 9 no longer has.

The cluster is thrown away after the module: the fuzzer may remove targets,
purge chunks and delete files, and the servers must keep answering properly.

With auth on (a second cluster), the same requests twice more: carrying a valid
credential (the admin token to the metadata server, the metadata server's own
cluster capability for that data server's target), so they reach the handlers, and
no answer is a server error; and carrying none, or one that is garbage, so every
route that is not public answers 401 and nothing is ever admitted, mutating or not.
And with a data server's own credentials (a join token, a target credential): every
route of the metadata server outside their purpose answers 403, whatever else the
request gets wrong.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import start_cluster
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stager.auth import KEY_FILE, Capability, load_key, sign
from stager.auth.tokens import ANY_FILE, CLUSTER
from stager.protocol import headers as H
from stager.protocol.routes import Route, routes_for
from stager.testing import ThreadCluster

pytestmark = pytest.mark.slow      # generated requests to both servers, minutes: not in make check

schemathesis = pytest.importorskip("schemathesis", reason="the dev extra installs schemathesis")

EXAMPLES = 50            # per operation, valid and invalid requests together
AUTH_EXAMPLES = 20       # ... with auth on and a valid credential
REFUSED_EXAMPLES = 8     # ... with auth on and no credential, or a garbage one
TIMEOUT = 20             # seconds per request; a hung handler fails the test

OPERATIONS = [pytest.param(role, r, id=f"{role}-{r.method}-{r.path}")
              for role in ("meta", "data") for r in routes_for(role)]


def load_documents(cluster: ThreadCluster) -> dict[str, tuple[Any, str]]:
    """Each role's schema, loaded from what a server of that role serves, and its URL."""
    urls = {"meta": cluster.meta_url, "data": cluster.data[0].url}  # type: ignore[union-attr]
    return {role: (schemathesis.openapi.from_url(url + "/openapi.json", timeout=TIMEOUT), url)
            for role, url in urls.items()}


@pytest.fixture(scope="module")
def documents(cluster: ThreadCluster) -> dict[str, tuple[Any, str]]:
    return load_documents(cluster)


# Generated attachments name any host: the servers may read no source but this one
# (none is there), so that no test reaches past loopback.
NO_SOURCES = "file:///nonexistent-fuzz-source/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fuzz"), attach_sources=NO_SOURCES)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadCluster]:
    c = start_cluster(tmp_path_factory.mktemp("auth-fuzz"), 3, auth=True,
                      attach_sources=NO_SOURCES)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def auth_documents(auth_cluster: ThreadCluster) -> dict[str, tuple[Any, str]]:
    return load_documents(auth_cluster)


@pytest.fixture(scope="module")
def credentials(auth_cluster: ThreadCluster) -> dict[str, dict[str, str]]:
    """The header that lets each role's server in: the admin token; the cluster
    capability, signed with the metadata server's key as it signs its own."""
    key = load_key(Path(auth_cluster.root) / "meta" / "auth" / KEY_FILE)
    data = auth_cluster.data[0]
    assert data is not None
    target = json.loads((data.root / "target.json").read_text())["target_id"]
    cap = sign(key, Capability.new(ANY_FILE, CLUSTER, "0" * 32, time.time(), 3600,
                                   target=target))
    kept = data.root / "target.credential"     # written once the registration answered
    deadline = time.monotonic() + 15
    while not kept.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    credential = kept.read_text().strip()
    return {"meta": {H.AUTHORIZATION: f"Bearer {auth_cluster.admin_token}"},
            "data": {H.CAPABILITY: cap},
            "join": {H.AUTHORIZATION: f"Bearer {auth_cluster.join_token}"},
            "target": {H.AUTHORIZATION: f"Bearer {credential}"}}


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    """One keep-alive connection pool for every request of the module."""
    import requests  # schemathesis's own transport

    with requests.Session() as s:
        yield s


@pytest.mark.parametrize("role, route", OPERATIONS)
def test_no_generated_request_gets_a_server_error(documents: dict[str, tuple[Any, str]],
                                                  session: Any, role: str, route: Route) -> None:
    schema, url = documents[role]
    fuzz(schema, url, route, EXAMPLES, lambda case: case.call(
        base_url=url, session=session, timeout=TIMEOUT),
         lambda reply, case: check_reply(reply, route, case.as_curl_command()))


@pytest.mark.parametrize("role, route", OPERATIONS)
def test_with_auth_on_no_generated_request_gets_a_server_error(
        auth_documents: dict[str, tuple[Any, str]], credentials: dict[str, dict[str, str]],
        session: Any, role: str, route: Route) -> None:
    schema, url = auth_documents[role]
    fuzz(schema, url, route, AUTH_EXAMPLES, lambda case: case.call(
        base_url=url, session=session, timeout=TIMEOUT, headers=credentials[role]),
         lambda reply, case: check_reply(reply, route, case.as_curl_command()))


CREDENTIAL_HEADERS = {H.AUTHORIZATION.lower(), H.CAPABILITY.lower()}
GARBAGE = {"meta": {H.AUTHORIZATION: "Bearer stg1.e30.AAAA"},
           "data": {H.CAPABILITY: "stg1.e30.AAAA not-a-capability"}}


@pytest.mark.parametrize("credential", ["none", "garbage"])
@pytest.mark.parametrize("role, route", OPERATIONS)
def test_with_auth_on_nothing_is_admitted_without_a_valid_credential(
        auth_documents: dict[str, tuple[Any, str]], session: Any, role: str, route: Route,
        credential: str) -> None:
    """Whatever else the request gets wrong, no credential (the fuzzer's own
    Authorization headers taken out) or a garbage one is a 401 first."""
    schema, url = auth_documents[role]

    def call(case: Any) -> Any:
        case.headers = {k: v for k, v in (case.headers or {}).items()
                        if k.lower() not in CREDENTIAL_HEADERS}
        extra = GARBAGE[role] if credential == "garbage" else None
        return case.call(base_url=url, session=session, timeout=TIMEOUT, headers=extra)

    def check(reply: Any, case: Any) -> None:
        check_reply(reply, route, case.as_curl_command())
        assert route.access is not None
        if route.access.scope != "public" and not no_route(reply):
            assert reply.status_code == 401, f"{reply.status_code} from {case.as_curl_command()}"

    fuzz(schema, url, route, REFUSED_EXAMPLES, call, check)


SERVER_PURPOSE = {"join": {"register_target"},
                  "target": {"register_target", "heartbeat", "heartbeats", "leave_target",
                             "scrub_report"}}
ELSEWHERE = [pytest.param(cred, r, id=f"{cred}-{r.method}-{r.path}")
             for cred, purpose in SERVER_PURPOSE.items() for r in routes_for("meta")
             if r.op not in purpose and r.access is not None and r.access.scope != "public"]


@pytest.mark.parametrize("cred, route", ELSEWHERE)
def test_with_auth_on_a_data_servers_credential_does_nothing_else(
        auth_documents: dict[str, tuple[Any, str]], credentials: dict[str, dict[str, str]],
        session: Any, cred: str, route: Route) -> None:
    """A stolen storage node's join token or target credential, on every route that is
    not its job: 403 before anything else is looked at."""
    from schemathesis.core.transport import Response

    schema, url = auth_documents["meta"]

    def call(case: Any) -> Any:
        # Sent here, not by case.call: a case that tests a missing Authorization
        # header would have schemathesis take the credential out again.
        kwargs = case.as_transport_kwargs(base_url=url)
        headers = {k: v for k, v in (kwargs.pop("headers", None) or {}).items()
                   if k.lower() not in CREDENTIAL_HEADERS}
        reply = session.request(**kwargs, headers={**headers, **credentials[cred]},
                                timeout=TIMEOUT, allow_redirects=False)
        return Response.from_requests(reply, verify=True)

    def check(reply: Any, case: Any) -> None:
        check_reply(reply, route, case.as_curl_command())
        if not no_route(reply):
            assert reply.status_code == 403, f"{reply.status_code} from {case.as_curl_command()}"

    fuzz(schema, url, route, REFUSED_EXAMPLES, call, check)


def fuzz(schema: Any, url: str, route: Route, examples: int, call: Callable[[Any], Any],
         check: Callable[[Any, Any], None]) -> None:
    """``examples`` generated requests (valid and invalid) for ``route``, each sent by
    ``call`` and its reply judged by ``check``."""
    operation = schema[route.path.replace(":.*}", "}")][route.method]
    modes = schemathesis.GenerationMode
    cases = st.one_of(operation.as_strategy(modes.POSITIVE),
                      operation.as_strategy(modes.NEGATIVE))

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def send(case: Any) -> None:
        # A control character in a header value is no HTTP (RFC 9110, 5.5): aiohttp's
        # parser answers 400 in plain text before any code of ours runs.
        assume(all(HEADER_VALUE.fullmatch(str(v)) for v in (case.headers or {}).values()))
        check(call(case), case)

    send()


HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


def no_route(reply: Any) -> bool:
    """The router's own 404: the URL matches no route's pattern (a path with a
    newline in it), so nothing was admitted to anything."""
    return reply.status_code == 404 and reply.json().get("message") == "no such route"


# The cluster's own state, not a fault: a layout asking for more replicas than there are
# nodes (or after the fuzzer removed targets) is 503 no_targets, where the route says so.
CLUSTER_STATE = {502: {"source_error"},     # an attached source that cannot be read
                 503: {"unavailable", "no_targets", "target_unavailable"},
                 507: {"no_space", "quota_exceeded"}}      # a quota the fuzzer set


def check_reply(reply: Any, route: Route, curl: str) -> None:
    """No server error; an error is ``{"error": CODE, "message": TEXT}`` in JSON."""
    status = reply.status_code
    where = f"{status} from {curl}: {reply.text[:300]!r}"
    if status < 400 or route.method == "HEAD":
        assert status < 500, where
        return
    content_type = reply.headers.get("content-type", [""])[0]    # schemathesis: name → values
    assert content_type.startswith("application/json"), where
    body = reply.json()
    assert isinstance(body, dict), where
    assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), where
    if status >= 500:
        assert status in route.responses and body["error"] in CLUSTER_STATE.get(status, ()), where
