import time

from stager import Client
from stager.protocol.manifest import Manifest, ManifestFile


def test_manifest(client: Client, ns: str) -> None:
    files = []
    for i in range(5):
        info = client.pipe(f"{ns}/ds/sub/f{i}", bytes([i]) * (i * 1000))
        files.append(ManifestFile(f"sub/f{i}", info.size, info.mtime, info.file_id))
    manifest = Manifest(f"{ns}/ds", tuple(files), source="test", created=time.time())
    assert client.put_manifest(manifest) == 5
    m = client.get_manifest(f"{ns}/ds")
    assert [f.path for f in m.files] == [f"sub/f{i}" for i in range(5)]
    assert not any(f.stale for f in m.files)
    assert m.files[3].layout is not None and len(m.files[3].checksums) == 1
    client.pipe(f"{ns}/ds/sub/f2", b"changed")
    m = client.get_manifest(f"{ns}/ds")
    assert m.files[2].stale and not m.files[1].stale
    assert client.get_manifest(f"{ns}/ds/sub") is None
    client.rename(f"{ns}/ds", f"{ns}/ds2")
    assert len(client.get_manifest(f"{ns}/ds2").files) == 5
    client.rm(f"{ns}/ds2", recursive=True)
    client.mkdir(f"{ns}/ds2")
    assert client.get_manifest(f"{ns}/ds2") is None


# -- decoding: the checks, on the client's path (bytes) and the server's (parsed JSON) --

import json  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stager.errors import BadRequest, InvalidPath  # noqa: E402
from stager.protocol import paths  # noqa: E402
from stager.protocol.models import Layout  # noqa: E402

LAYOUT = Layout(4 << 20, 2, 1, ("t0", "t1"), ("n0", "n1"))
ID = "0123456789abcdef" * 2


def resolved(*files: dict, **top: object) -> dict:
    return {"version": 1, "path": "/ds", "source": "s", "created": 2.5, "extra": {"k": 1},
            "files": list(files), "layouts": [LAYOUT.to_json()],
            "locations": {"t0": "http://a", "t1": "http://b"}, **top}


def entry(path: str = "a/b", **fields: object) -> dict:
    return {"path": path, "size": 5, "mtime": 1.5, "file_id": ID, "layout": 0,
            "checksums": ["0000000a", "FFFFFFFF"], **fields}


def both(obj: object) -> Manifest:
    """``obj`` parsed as the server does (parsed JSON) and as a client does (bytes);
    they must agree, in the answer or in the error."""
    try:
        parsed = Manifest.from_json(obj)
    except BadRequest as exc:
        with pytest.raises(BadRequest) as raised:
            Manifest.decode(json.dumps(obj).encode())
        assert type(raised.value) is type(exc)
        raise
    assert Manifest.decode(json.dumps(obj).encode()) == parsed
    return parsed


def test_decode_resolved() -> None:
    m = both(resolved(entry("a/b"), entry("c", stale=True, size=0),
                      {"path": "d", "size": 1, "mtime": 3, "file_id": ID, "stale": True},
                      {"path": "e", "size": 2, "file_id": ID}))
    assert m.path == "/ds" and m.source == "s" and m.created == 2.5 and m.extra == {"k": 1}
    assert m.locations == {"t0": "http://a", "t1": "http://b"}
    assert m.files == (
        ManifestFile("a/b", 5, 1.5, ID, LAYOUT, (10, 0xFFFFFFFF)),
        ManifestFile("c", 0, 1.5, ID, LAYOUT, (10, 0xFFFFFFFF), stale=True),
        ManifestFile("d", 1, 3.0, ID, stale=True),
        ManifestFile("e", 2, 0.0, ID))
    assert m.total_bytes == 8
    assert m.file_info(m.files[0]).path == "/ds/a/b"
    stored = Manifest.from_json(m.to_json(), "/elsewhere")
    assert stored.path == "/elsewhere"
    assert [(f.path, f.size, f.mtime, f.file_id) for f in stored.files] == \
        [(f.path, f.size, f.mtime, f.file_id) for f in m.files]
    assert both(resolved()).files == ()


@pytest.mark.parametrize("rel", [
    "a", "a/b/c", "sp ace/é.jpg", "x" * 255, "é" * 127, "a\x7fb", "a\u00a0b", "a\u2028b",
    "..a/b..", ".hidden", "/".join(["d" * 200] * 20)])
def test_paths_that_are_canonical(rel: str) -> None:
    assert both(resolved(entry(rel))).files[0].path == rel


@pytest.mark.parametrize("rel, message", [
    ("/a", "relative and canonical"), ("a/", "relative and canonical"),
    ("", "relative and canonical"), ("a//b", "invalid path segment ''"),
    ("./a", r"segment '\.'"), ("a/./b", r"segment '\.'"), ("a/../b", r"segment '\.\.'"),
    ("..", r"segment '\.\.'"), ("a\nb", "control character"), ("a\x00b", "NUL"),
    ("a\x1f", "control character"), ("x" * 256, "segment too long"),
    ("a/" + "é" * 128, "segment too long"), ("/".join(["d" * 200] * 21), "path too long"),
    ("\ud800", "lone surrogate")])
def test_paths_that_are_not(rel: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        Manifest.from_json(resolved(entry(rel)))
    if rel != "\ud800":    # not encodable: JSON text cannot carry it but as an escape
        with pytest.raises(BadRequest, match=message):
            Manifest.decode(json.dumps(resolved(entry(rel))).encode())


def test_the_bad_one_among_many_is_named() -> None:
    good = [entry(f"shard{i // 100}/f{i:05d}") for i in range(2000)]
    both(resolved(*good))
    with pytest.raises(BadRequest, match=r"'shard3/\.\./f01234'"):
        both(resolved(*good[:1234], entry("shard3/../f01234"), *good[1234:]))
    with pytest.raises(BadRequest, match="invalid file id '0123"):
        both(resolved(*good, entry(file_id=ID[:-1] + "g")))
    with pytest.raises(BadRequest, match="not '0000000z'"):
        both(resolved(*good, entry(checksums=["00000001", "0000000z"])))


@pytest.mark.parametrize("fields, message", [
    ({"file_id": ID.upper()}, "invalid file id"), ({"file_id": ID[:31]}, "invalid file id"),
    ({"file_id": ID + "0"}, "invalid file id"), ({"file_id": "g" * 32}, "invalid file id"),
    ({"file_id": 7}, r"Expected `str`, got `int` - at `\$.files\[0\].file_id`"),
    ({"file_id": None}, "file_id"),
    ({"size": -1}, r"`int` >= 0 - at `\$.files\[0\].size`"), ({"size": 1 << 63}, "size"),
    ({"size": 1.5}, "size"), ({"size": True}, "size"), ({"size": "1"}, "size"),
    ({"mtime": "x"}, "mtime"), ({"mtime": True}, "mtime"),
    ({"layout": 1}, "'a/b' refers to a missing layout"), ({"layout": -1}, "layout"),
    ({"layout": "0"}, "layout"), ({"layout": True}, "layout"),
    ({"checksums": ["0000000"]}, "checksums"), ({"checksums": ["000000000"]}, "checksums"),
    ({"checksums": ["0000000g"]}, "8-digit hex strings, not '0000000g'"),
    ({"checksums": [" 0000000"]}, "8-digit hex strings, not ' 0000000'"),
    ({"checksums": ["0x000000"]}, "8-digit hex strings"),
    ({"checksums": [12345678]}, "checksums"), ({"checksums": "0000000a"}, "checksums"),
    ({"stale": "yes"}, "stale"), ({"path": 3}, "path")])
def test_files_that_are_malformed(fields: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        both(resolved(entry(), **{}) | {"files": [entry(**fields)]})


def test_missing_fields() -> None:
    for key in ("path", "size", "file_id"):
        raw = entry()
        del raw[key]
        with pytest.raises(BadRequest, match=f"missing required field `{key}`"):
            both(resolved(raw))
    with pytest.raises(BadRequest, match="missing required field `files`"):
        both({"version": 1})


@pytest.mark.parametrize("body, message", [
    (resolved(version=2), "unsupported manifest version 2"),
    ([], "Expected `object`, got `array`"), (resolved(layouts=[{"x": 1}]), "targets"),
    (resolved(layouts=[LAYOUT.to_json() | {"stripe_count": 3}]), "stripe_count"),
    (resolved(locations={"t0": 1}), "locations"), (resolved(extra=[]), "extra"),
    (resolved(source=1), "source"), (resolved(created="now"), "created")])
def test_bodies_that_are_malformed(body: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        both(body)


def test_text_that_is_not_json() -> None:
    for text in (b"{", b"", b"\xff", b'{"files": [1'):
        with pytest.raises(BadRequest, match="invalid manifest"):
            Manifest.decode(text)


def canonical(rel: str) -> bool:
    """The rule, one path at a time: a relative path whose absolute form is canonical."""
    try:
        return bool(rel) and rel[0] != "/" and rel[-1] != "/" and \
            paths.normalize("/" + rel) == "/" + rel
    except InvalidPath:
        return False


PIECES = st.sampled_from(["a", "b", "/", ".", "..", "é", "\x7f", "\n", "\x00", "\x1f", " ",
                          "\u00a0", "x" * 100, "é" * 60, "\ud800"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(PIECES, max_size=12).map("".join), max_size=6))
def test_all_at_once_agrees_with_one_at_a_time(rels: list[str]) -> None:
    body = resolved(*[entry(rel) for rel in rels])
    if all(canonical(rel) for rel in rels):
        assert [f.path for f in Manifest.from_json(body).files] == rels
    else:
        first_bad = next(rel for rel in rels if not canonical(rel))
        with pytest.raises(BadRequest) as raised:
            Manifest.from_json(body)
        assert repr(first_bad) in str(raised.value)
