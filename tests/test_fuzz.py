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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stager.protocol.routes import Route, routes_for
from stager.testing import ThreadCluster

schemathesis = pytest.importorskip("schemathesis", reason="the dev extra installs schemathesis")

EXAMPLES = 50            # per operation, valid and invalid requests together
TIMEOUT = 20             # seconds per request; a hung handler fails the test

OPERATIONS = [pytest.param(role, r, id=f"{role}-{r.method}-{r.path}")
              for role in ("meta", "data") for r in routes_for(role)]


@pytest.fixture(scope="module")
def documents(cluster: ThreadCluster) -> dict[str, tuple[Any, str]]:
    """Each role's schema, loaded from what a server of that role serves, and its URL."""
    urls = {"meta": cluster.meta_url, "data": cluster.data[0].url}  # type: ignore[union-attr]
    return {role: (schemathesis.openapi.from_url(url + "/openapi.json", timeout=TIMEOUT), url)
            for role, url in urls.items()}


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
    operation = schema[route.path.replace(":.*}", "}")][route.method]
    modes = schemathesis.GenerationMode
    cases = st.one_of(operation.as_strategy(modes.POSITIVE),
                      operation.as_strategy(modes.NEGATIVE))

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def send(case: Any) -> None:
        reply = case.call(base_url=url, session=session, timeout=TIMEOUT)
        check_reply(reply, route, case.as_curl_command())

    send()


# The cluster's own state, not a fault: a layout asking for more replicas than there are
# nodes (or after the fuzzer removed targets) is 503 no_targets, where the route says so.
CLUSTER_STATE = {503: {"unavailable", "no_targets", "target_unavailable"}, 507: {"no_space"}}


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
