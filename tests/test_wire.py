"""The wire contract: the error table round-trips, and URLs come from the route table."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import jsonschema
import pytest

import stager.errors as errors_module
from stager import AsyncClient
from stager.errors import (
    ERROR_TABLE,
    BadRequest,
    InternalError,
    StagerError,
    TargetUnavailable,
    Unavailable,
    error_from_wire,
    unreachable,
)
from stager.protocol import cache
from stager.protocol import cluster as c
from stager.protocol import jobreport as j
from stager.protocol import messages as m
from stager.protocol import multipart as mp
from stager.protocol import quotas as q
from stager.protocol.authmsg import (
    CapabilityRequest,
    PublicKey,
    TargetRegistered,
    TokenCreated,
    TokenInfo,
    TokenList,
    TokenRequest,
)
from stager.protocol.batch import CommitItem, CreateItem
from stager.protocol.models import (
    INT64_MAX,
    FileInfo,
    Layout,
    LayoutSpec,
    ReadItem,
    TargetInfo,
)
from stager.protocol.openapi import SCHEMAS
from stager.protocol.routes import ROUTES, route
from stager.protocol.s3keys import S3KeyCreated, S3KeyInfo, S3KeyList, S3Verdict, S3VerifyRequest
from stager.web.middleware import error_response


def _error_classes() -> list[type[StagerError]]:
    return [obj for obj in vars(errors_module).values()
            if isinstance(obj, type) and issubclass(obj, StagerError) and obj is not StagerError]


def test_every_error_class_is_in_the_table() -> None:
    listed = {cls for cls, _, _ in ERROR_TABLE}
    assert set(_error_classes()) == listed
    codes = [code for _, _, code in ERROR_TABLE]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_error_class_round_trips_through_the_wire(cls: type[StagerError]) -> None:
    """class -> the server's response (status + JSON body) -> the same class."""
    sent = cls("it broke", where="here")
    response = error_response(sent)
    assert response.status == sent.status
    assert response.body is not None
    got = error_from_wire(response.status, bytes(response.body))   # type: ignore[arg-type]
    assert type(got) is cls
    assert got.message == "it broke" and got.details == {"where": "here"}
    assert got.status == sent.status and got.code == sent.code


def test_a_body_that_is_not_json_is_decoded_by_status() -> None:
    assert type(error_from_wire(404, b"<html>not found</html>")) is BadRequest
    assert type(error_from_wire(500, b"oops")) is InternalError
    assert type(error_from_wire(503, b"")) is Unavailable


def test_transport_failures_become_unavailable() -> None:
    err = unreachable(ConnectionRefusedError("refused"), "metadata server M unreachable",
                      url="M")
    assert type(err) is Unavailable and "ConnectionRefusedError" in str(err)
    err = unreachable(TimeoutError(), "target t0 at U unreachable", target="t0", url="U")
    assert type(err) is TargetUnavailable and err.details == {"target": "t0", "url": "U"}


# -- URLs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path, want", [
    ("/a/b", "/v1/stat/a/b"),
    ("a b/c", "/v1/stat/a%20b/c"),
    ("/100%/x?y#z", "/v1/stat/100%25/x%3Fy%23z"),
    ("/ü+&=;", "/v1/stat/%C3%BC%2B%26%3D%3B"),
    ("/", "/v1/stat/"),
])
def test_rest_of_path_parameters_keep_their_slashes(path: str, want: str) -> None:
    assert route("stat").target(path=path) == want
    assert route("stat").url("http://h:1/", path=path) == "http://h:1" + want


def test_segment_parameters_are_quoted_whole() -> None:
    assert route("remove_target").target(target_id="a/b c") == "/v1/targets/a%2Fb%20c/remove"
    assert (route("report_rank").target(job="j/1", rank=3, query={"worker": 2})
            == "/v1/jobs/j%2F1/ranks/3?worker=2")


def test_query_values_are_encoded_and_none_left_out() -> None:
    got = route("list").target(path="d", query={"after": "a&b c", "limit": None,
                                                "detail": False})
    assert got == "/v1/list/d?after=a%26b+c&detail=false"
    assert route("list").target(path="d", query={"after": ""}) == "/v1/list/d?after="


def test_every_route_builds_and_names_its_parameters() -> None:
    for r in ROUTES:
        names = re.findall(r"\{(\w+)", r.path)
        assert sorted(names) == sorted(r.path_params), r.op
        r.target(**{n: "x" for n in names})
        with pytest.raises(KeyError):
            r.target(**{n: "x" for n in names}, bogus="y")
    with pytest.raises(KeyError):
        route("stat").target()


async def test_odd_names_travel_whole(aclient: AsyncClient, ns: str) -> None:
    """A name with every character URLs treat specially reaches the server intact."""
    odd = f"{ns}/a b/100% #1?x=y&z+ü;,@"
    await aclient.pipe(odd, b"odd")
    assert (await aclient.stat(odd, cached=False)).path == odd
    assert [e.path for e in await aclient.ls(f"{ns}/a b")] == [odd]
    assert await aclient.cat(odd) == b"odd"
    # pages continue "after" an odd name: the query is quoted too
    second = f"{ns}/a b/100% #1?x=y&z+ü;,@ 2"
    await aclient.pipe(second, b"2")
    paged = [e.path async for e in aclient.iter_dir(f"{ns}/a b", page_size=1)]
    assert paged == [odd, second]
    assert await aclient.rm(f"{ns}", recursive=True) == 2


# -- models --------------------------------------------------------------------------------
_ATTACHMENT = cache.Attachment("/d", "https://h/data/", None, ("*.tar",), (), 5.0, 3, 30, 10,
                               2, 4, 1)


def _answers() -> dict[str, object]:
    """An example of each answer model of the cluster, maintenance and jobs routes."""
    target = TargetInfo("t0", "n0", "http://h:1", capacity=10, used=2, state="up")
    return {
        "Status": c.Status((target,), 1, 1, 10, 2, 3, 1, 7,
                           {"targets_lost": 0, "fsck": None, "repair": {"pending": 0}},
                           (c.MetaServer("http://m:1", "sqlite:/r/meta.sqlite3", "up", True,
                                         5.0),), {"t1": 600.5}),
        "ScrubQueued": c.ScrubQueued(2),
        "ScrubResult": c.ScrubResult({"t0": {"checked": 1, "bytes": 5, "corrupt": [],
                                             "seconds": 0.1}}, 1, 5, 0, 0, 0, 0, 0, ("t1",),
                                     0.2),
        "FsckResult": c.FsckResult(3, 4, 5, 1, ({"file_id": "a" * 32, "chunk": "a" * 32 + ".0",
                                                "target": "t0", "path": None},), 1,
                                   ({"target": "t0", "chunk": "b" * 32 + ".0"},), ("t1",), 0,
                                   1, 0, False, 0.5),
        "RankRecorded": j.RankRecorded("job", 1, None, 12.5),
        "Quota": q.Quota("/d", 1 << 30, None, 5, 1),
        "QuotaList": q.QuotaList((q.Quota("/d", None, 10, 0, 0),)),
        "Pin": q.Pin("/d", 12.5, 2.0),
        "PinList": q.PinList((q.Pin("/d", None, 2.0),)),
        "Unpinned": q.Unpinned("/d"),
        "Attachment": _ATTACHMENT,
        "AttachmentList": cache.AttachmentList((_ATTACHMENT,)),
        "Refreshed": cache.Refreshed(_ATTACHMENT, 1, 2, 3, 4),
        "Detached": cache.Detached("/d", 3, 7),
        "PlanRegistered": cache.PlanRegistered("a" * 32, 2, 5.0),
        "JobList": j.JobList((j.JobStatus("job", {"worst_stall_fraction": 0.5},
                                          ({"job": "job", "rank": 0, "worker": None},)),)),
    }


@pytest.mark.parametrize("model", [
    m.Heartbeat(1, 2, 3, 4, 5),
    m.Heartbeat(scrub=m.ScrubProgress("running", 1, 2, 3, 4, 5, 0, 9.5)),
    m.ScrubRequest(), m.ScrubRequest(1 << 20), m.FsckRequest(True),
    m.ScrubReport("t0", ("a" * 32 + ".1",)),
    m.MkdirRequest("/d", True, True, LayoutSpec(chunk_size=8192)),
    m.SetLayoutRequest("/d", LayoutSpec(replicas=2)),
    m.RerouteRequest("t1", "target_unavailable", "refused", (m.RerouteItem("a" * 32, 3),)),
    m.RenameRequest("/a", "/b", True),
    m.RemoveRequest("/a", True), m.RemoveResult(3),
    m.ManifestStored("/d", 4),
    m.ReadRequest((ReadItem("a" * 32 + ".0", 0, 10),)),
    m.PurgeRequest(("b" * 32,)),
    mp.SealRequest("b" * 32, 2, ((1, 5),)), mp.SealRequest("b" * 32, 0, (), release=True),
    mp.SealResult(()),
    m.ChunkStored("a" * 32 + ".0", 1, 0xdeadbeef), m.ChunkBatchStored(2, 3),
    m.ChunkDeleted(False),
    m.Listing("/d", (FileInfo("/d/x", "file", 3),), "x"),
    m.Health("meta", "1.0"), m.Health("data", "1.0", "t0", "n0"),
    *(example for name, example in sorted(_answers().items())),
], ids=lambda v: type(v).__name__)
def test_models_round_trip_through_json(model: object) -> None:
    wire = json.loads(json.dumps(model.to_json()))    # type: ignore[attr-defined]
    assert type(model).from_json(wire) == model      # type: ignore[attr-defined]


def test_models_reject_bad_fields() -> None:
    for bad in ({}, {"path": 1}, {"path": "/a", "recursive": "yes"}):
        with pytest.raises(BadRequest):
            m.RemoveRequest.from_json(bad)
    with pytest.raises(BadRequest):
        m.PurgeRequest.from_json({"file_ids": ["../x"]})
    for rate in (-1, 1, m.MIN_SCRUB_RATE - 1, INT64_MAX + 1):   # 1 B/s: a scrub for days
        with pytest.raises(BadRequest, match="rate"):
            m.ScrubRequest.from_json({"rate": rate})
    assert m.ScrubRequest.from_json({"rate": 0}).rate == 0
    assert m.ScrubRequest.from_json({"rate": INT64_MAX}).rate == INT64_MAX
    with pytest.raises(BadRequest):
        m.ScrubReport.from_json({"target": "t0", "chunks": [1]})
    with pytest.raises(BadRequest):
        c.FsckResult.from_json({**_answers()["FsckResult"].to_json(),  # type: ignore[attr-defined]
                                "missing": "1"})
    with pytest.raises(BadRequest):
        j.JobList.from_json({"jobs": [{"job": "x", "summary": {}, "ranks": [1]}]})


@pytest.mark.parametrize("parse, field, base", [
    (TargetInfo.from_json, "used", {"id": "t0", "node": "n0", "url": "http://h:1"}),
    (TargetInfo.from_json, "capacity", {"id": "t0", "node": "n0", "url": "http://h:1"}),
    (m.Heartbeat.from_json, "chunks", {}),
    (CommitItem.from_json, "size", {"file_id": "a" * 32, "checksums": []}),
])
def test_counts_are_bounded_to_what_sqlite_stores(parse, field: str, base: dict) -> None:  # type: ignore[no-untyped-def]
    """A count past a signed 64-bit integer was a 500 from the store (issue 18): now a 400."""
    assert getattr(parse({**base, field: INT64_MAX}), field) == INT64_MAX
    for bad in (INT64_MAX + 1, 1 << 64, -1):
        with pytest.raises(BadRequest, match=repr(field)):
            parse({**base, field: bad})
    with pytest.raises(BadRequest):
        ReadItem.from_json(["a" * 32 + ".0", INT64_MAX + 1, 1])


def test_status_keeps_the_sections_of_the_background_services_on_the_top_level() -> None:
    wire = _answers()["Status"].to_json()      # type: ignore[attr-defined]
    assert wire["targets_lost"] == 0 and wire["repair"] == {"pending": 0}
    assert c.Status.from_json(wire).sections == {"targets_lost": 0, "fsck": None,
                                                 "repair": {"pending": 0}}
    assert wire["metas"][0]["duties"] is True and wire["lost_at"] == {"t1": 600.5}
    assert c.Status.from_json(wire) == _answers()["Status"]
    with pytest.raises(BadRequest):
        c.Status.from_json({**wire, "lost_at": {"t1": "soon"}})


# -- the OpenAPI document describes the models ----------------------------------------------
def _multipart_examples(layout: Layout) -> dict[str, object]:
    upload = mp.MultipartUpload("a" * 32, "/b/k", "f" * 32, layout, 8192, 1.0, 2.0, "{}")
    slot = mp.PartSlot("f" * 32, 2, layout, {"t0": "http://h:1"})
    part = mp.Part(1, 10, "0" * 32, 1.0)
    return {
        "MultipartCreate": mp.MultipartCreate("/b/k"), "MultipartUpload": upload,
        "PartBegin": mp.PartBegin(10), "PartSlot": slot,
        "PartDone": mp.PartDone("f" * 32, 2, 10, "0" * 32, (7,)), "Part": part,
        "PartList": mp.PartList(upload, (part,)), "MultipartList": mp.MultipartList((upload,)),
        "CompleteRequest": mp.CompleteRequest(((1, "0" * 32),)),
        "CompleteResult": mp.CompleteResult("0" * 32 + "-1", (10,),
                                            compose=(mp.Part(1, 10, "0" * 32, 1.0, slot, (7,)),)),
        "SealRequest": mp.SealRequest("f" * 32, 3, ((0, 7), (2, 0xdeadbeef))),
        "SealResult": mp.SealResult((2,)),
    }


def _examples() -> dict[str, object]:
    layout = Layout(8192, 1, 1, ("t0",), ("n0",))
    return {
        "Heartbeat": m.Heartbeat(1, 2, 3, 4, 5, m.ScrubProgress()),
        "ScrubProgress": m.ScrubProgress("running", 1, 2, 3, 4, 5),
        "TargetList": m.TargetList((TargetInfo("t0", "n0", "http://h:1"),)),
        "ScrubRequest": m.ScrubRequest(5),
        "ScrubReport": m.ScrubReport("t0", ()),
        "FsckRequest": m.FsckRequest(True),
        "QuotaRequest": q.QuotaRequest(1 << 30, 10),
        "PinRequest": q.PinRequest(60.0),
        "PlanRequest": cache.PlanRequest({"seed": 1}, {"files": []}, cache.PlanPosition(1, 2)),
        "PlanPosition": cache.PlanPosition(1, 2),
        "ReadsCounted": cache.ReadsCounted(3),
        "AttachRequest": cache.AttachRequest("s3://bucket/data", 60.0, ("*.tar",), ("*.log",),
                                             {"endpoint_url": "http://h:1"}),
        "Listing": m.Listing("/d", (), "x"),
        "MkdirRequest": m.MkdirRequest("/d", True, True, LayoutSpec(replicas=1)),
        "SetLayoutRequest": m.SetLayoutRequest("/d", LayoutSpec(replicas=1)),
        "CreateItem": CreateItem("/f", LayoutSpec(replicas=1)),
        "Upload": m.Upload("a" * 32, "/f", layout, {"t0": "http://h:1"}, "stg1.cap.sig"),
        "CommitItem": CommitItem("a" * 32, 1, (0,), 1.0),
        "RerouteRequest": m.RerouteRequest("t0", "no_space", "full", (m.RerouteItem("a" * 32, 1),)),
        "RenameRequest": m.RenameRequest("/a", "/b"),
        "RemoveRequest": m.RemoveRequest("/a"),
        "RemoveResult": m.RemoveResult(1),
        "ReadRequest": m.ReadRequest(()),
        "PurgeRequest": m.PurgeRequest(()),
        "ChunkInfo": m.ChunkStored("a" * 32 + ".0", 1, 7),
        "ChunkBatchInfo": m.ChunkBatchStored(1, 2),
        "ChunkDeleted": m.ChunkDeleted(True),
        "ManifestStored": m.ManifestStored("/d", 1),
        "Health": m.Health("data", "1.0", "t0", "n0"),
        "TargetRegistered": TargetRegistered(TargetInfo("t0", "n0", "http://h:1"),
                                             "stg1.x.y"),
        "TokenRequest": TokenRequest(("read",), ("/d",), 60, "team", None),
        "TokenInfo": TokenInfo("a" * 32, "team", ("read",), ("/d",), 1, 2, 3),
        "TokenCreated": TokenCreated("stg1.x.y", TokenInfo("a" * 32, "t", ("read",), ("/",),
                                                           1, 2)),
        "TokenList": TokenList(()),
        "CapabilityRequest": CapabilityRequest("read", ("a" * 32,)),
        "PublicKey": PublicKey("k" * 43),
        "S3KeyCreated": S3KeyCreated("stg1.x.y", TokenInfo("a" * 32, "t", ("read",), ("/",), 1, 2),
                                     "STG" + "A" * 17, "s" * 40),
        "S3KeyList": S3KeyList((S3KeyInfo("STG" + "A" * 17, "a" * 32, 1),)),
        "S3VerifyRequest": S3VerifyRequest("STG" + "A" * 17, "20260101/us-east-1/s3/aws4_request",
                                           "AWS4-HMAC-SHA256\n...", "0" * 64),
        "S3Verdict": S3Verdict(signing_key="0" * 64, token="stg1.x.y", token_id="a" * 32,
                               expires=2),
        **_multipart_examples(layout),
        **_answers(),
        # the services' sections are additional properties; the schema names the rest
        "Status": replace(_answers()["Status"], sections={}),   # type: ignore[type-var]
    }


@pytest.mark.parametrize("name", sorted(_examples()))
def test_the_openapi_schema_names_every_field_of_its_model(name: str) -> None:
    schema = SCHEMAS[name]
    sent = _examples()[name].to_json()      # type: ignore[attr-defined]
    assert set(sent) <= set(schema["properties"]), name
    assert set(schema["required"]) <= set(sent), name


def test_every_json_request_body_has_a_model() -> None:
    bodies = {r.body for r in ROUTES if r.body not in (None, "binary")}
    parsed_elsewhere = {"Target", "Manifest", "JobReport",
                        "CreateRequest", "CommitRequest", "AbortRequest",
                        "FillRequest", "HeartbeatBatch", "JobReportBatch"}   # batches
    assert bodies - parsed_elsewhere <= set(_examples())


def test_every_json_answer_has_a_model() -> None:
    answers = {s for r in ROUTES for s in r.responses.values()
               if s not in ("binary", "text", "ndjson", "asset", "Error")}
    shaped_elsewhere = {"object",           # /openapi.json: the document itself
                        "Target", "FileInfo", "Manifest", "CreateResult",
                        "CommitResult", "AbortResult",
                        "CapabilityResult", "FillResults"}  # batch answers (results_json)
    assert answers - shaped_elsewhere <= set(_examples())


def test_a_batched_heartbeat_item_round_trips() -> None:
    """``POST /v1/heartbeats`` (issue 30): an item with and without its credential."""
    from stager.protocol.heartbeats import BeatItem

    for item in (BeatItem("t0", m.Heartbeat(1, 2, 3, 4, 5)),
                 BeatItem("t1", m.Heartbeat(scrub=m.ScrubProgress("idle")), "stg1.x.y")):
        assert BeatItem.from_json(json.loads(json.dumps(item.to_json()))) == item
    for bad in ({"target_id": "../x", "heartbeat": {}}, {"target_id": "t0"},
                {"target_id": "t0", "heartbeat": {}, "credential": ""}):
        with pytest.raises(BadRequest):
            BeatItem.from_json(bad)


def test_a_file_versions_attrs_ride_with_its_info_commit_and_completion() -> None:
    """``attrs`` (issue 29): round-trips where set, absent from the wire where empty (so
    every other answer keeps its shape), a JSON object of at most MAX_ATTRS bytes."""
    from stager.protocol.models import MAX_ATTRS

    attrs = {"s3": {"etag": '"e"', "metadata": {"k": "v"}}}
    for model in (FileInfo("/d/x", "file", 3, file_id="a" * 32, attrs=attrs),
                  CommitItem("a" * 32, 0, (), attrs=attrs),
                  mp.CompleteRequest(((1, "b" * 32),), attrs)):
        wire = json.loads(json.dumps(model.to_json()))
        assert wire["attrs"] == attrs and type(model).from_json(wire) == model
        assert "attrs" not in replace(model, attrs={}).to_json()
    assert {"attrs", "Attrs"} <= set(SCHEMAS["FileInfo"]["properties"]) | set(SCHEMAS)
    for bad in ([1], "x", {"s3": "x" * MAX_ATTRS}):
        with pytest.raises(BadRequest, match="attrs"):
            CommitItem.from_json({"file_id": "a" * 32, "size": 0, "checksums": [],
                                  "attrs": bad})


def test_a_batch_of_loader_reports_round_trips() -> None:
    """``POST /v1/jobs/reports`` (issue 30): items as a reporter sends them read back
    as the entries they name; a bad item fails the batch with its index."""
    from stager.protocol.jobreport import RankReport, batch_item, decode_batch

    report = {"interval": 1, "world_size": 2, "samples": 3, "unknown": "dropped"}
    body = {"items": [batch_item("j", 0, report), batch_item("j", 1, report, worker=0)]}
    got = decode_batch(json.dumps(body).encode())
    assert [(r.job, r.rank, r.worker) for r in got] == [("j", 0, None), ("j", 1, 0)]
    assert isinstance(got[0], RankReport) and "unknown" not in got[0].report
    assert got[0].report["interval"] == 1.0 and got[0].report["targets"] == []
    bad = {"items": [batch_item("j", 0, report), batch_item("j", 2, report)]}
    with pytest.raises(BadRequest) as caught:
        decode_batch(json.dumps(bad).encode())
    assert caught.value.details["index"] == 1


def test_a_page_with_shared_layouts_is_asked_for_and_described() -> None:
    """``GET /v1/list/{path}?layouts=shared`` (issue 30): each layout once, in the page's
    ``layouts`` (with its targets' URLs), each entry's layout its index there; the
    document describes that page too."""
    from stager.meta.listing import wire_entries
    from stager.protocol.listing import SHARED, listing_body

    assert route("list").target(path="d", query={"layouts": SHARED}) == "/v1/list/d?layouts=shared"
    layout = Layout(8192, 1, 1, ("t0",), ("n0",))
    rows = [(f"/d/f{i}", "file", 1, 1.0, "a" * 32, layout, None, (7,), {}) for i in range(2)]
    layouts: list = []                                      # type: ignore[type-arg]
    page = json.loads(listing_body("/d", wire_entries(rows, lambda _: {"t0": "http://h:1"},
                                                      layouts), None, layouts=layouts))
    assert page["layouts"] == [{**layout.to_json(), "locations": {"t0": "http://h:1"}}]
    assert [e["layout"] for e in page["entries"]] == [0, 0]
    document = {"$ref": "#/components/schemas/Listing", "components": {"schemas": SCHEMAS}}
    jsonschema.validate(page, document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**page, "layouts": [{"locations": 5}]}, document)


def test_a_capability_by_reference_and_its_refusal_on_the_wire() -> None:
    """``X-Stager-Capability`` items are texts or ``ref1.<id>`` (stager/auth/refs.py):
    the client and the data server compute the same id from a text; an id the server
    does not hold is a 401 whose reason the client reads to send the texts again."""
    from stager.auth.refs import UNKNOWN, reference

    text = "stg1.eyJ0eXAiOiJjYXAifQ.c2ln"
    ref = reference(text)
    assert ref == "ref1.eDcXii8sx5Cuadl5NmqY_TsA"
    header = f"{ref} stg1.eyJ0eXAiOiJjYXAifQ.b3RoZXI"     # a reference among texts
    assert header.split()[0] == ref and re.fullmatch(r"ref1\.[A-Za-z0-9_-]{24}", ref)
    response = error_response(errors_module.Unauthenticated("no such reference",
                                                            reason=UNKNOWN))
    assert response.status == 401
    body = bytes(response.body)                                  # type: ignore[arg-type]
    assert json.loads(body) == {"error": "unauthenticated", "message": "no such reference",
                                "details": {"reason": "unknown_reference"}}
    got = error_from_wire(401, body)
    assert isinstance(got, errors_module.Unauthenticated)
    assert got.details["reason"] == UNKNOWN
