"""The auth library alone: keys on disk, the token wire form, every refusal, the policy.

No server here: these are the pure parts the servers and the client will wire
in (issue 18).  Each refusal is checked for its class *and* its reason, so a
check that let the wrong thing through for the right-looking error would fail.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from stager.auth import (
    CLOCK_SKEW,
    KEY_FILE,
    Capability,
    CapabilityCache,
    MemoryRevocations,
    Revocations,
    Token,
    acts_for,
    allows,
    capability_allows,
    expires_at,
    generate_key,
    load_key,
    load_or_create_key,
    load_public_key,
    public_key_text,
    require,
    require_capability,
    sign,
    verify,
    verify_capability,
    verify_token,
    visible,
)
from stager.errors import BadRequest, Forbidden, Unauthenticated, error_from_wire

NOW = 1_800_000_000
KEY = Ed25519PrivateKey.generate()
PUBLIC = KEY.public_key()
OTHER = Ed25519PrivateKey.generate()
FILE_A, FILE_B, HOLDER = "a" * 32, "b" * 32, "c" * 32


def token(scopes: set[str] | None = None, prefixes: list[str] | None = None,
          ttl: int = 3600) -> Token:
    return Token.new("team-a", scopes or {"read"}, prefixes or ["/datasets/imagenet"], ttl,
                     NOW)


def refused(reason: str, text: str, now: float = NOW) -> Unauthenticated:
    with pytest.raises(Unauthenticated) as info:
        verify(PUBLIC, text, now)
    assert info.value.details["reason"] == reason, info.value
    assert info.value.status == 401 and info.value.code == "unauthenticated"
    return info.value


def signed_payload(payload: object) -> str:
    """A text our own key signed around ``payload``, built here from the documented
    wire form (not by the code under test): it gets past the signature to the JSON checks."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    signed = "stg1." + _b64(raw)
    return f"{signed}.{_b64(KEY.sign(signed.encode()))}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_the_wire_form_is_the_documented_one() -> None:
    t = token()
    assert signed_payload(json.loads(json.dumps(t.to_json()))) != sign(KEY, t)  # spacing
    canonical = json.dumps(t.to_json(), sort_keys=True, separators=(",", ":")).encode()
    assert signed_payload(canonical) == sign(KEY, t)         # Ed25519 is deterministic
    assert verify(PUBLIC, signed_payload(t.to_json()), NOW) == t


# -- round trips ---------------------------------------------------------------------------

def test_a_token_round_trips() -> None:
    t = token({"read", "write"}, ["/b/", "/a", "/a"])
    text = sign(KEY, t)
    assert text.startswith("stg1.") and text.count(".") == 2
    got = verify(PUBLIC, text, NOW)
    assert got == t and isinstance(got, Token)
    assert got.prefixes == ("/a", "/b") and got.scopes == {"read", "write"}
    assert len(got.id) == 32 and got.id != token().id
    assert verify_token(PUBLIC, text, NOW, MemoryRevocations()) == t
    assert expires_at(text) == NOW + 3600


def test_a_capability_round_trips() -> None:
    cap = Capability.new(FILE_A, "write", HOLDER, NOW)
    text = sign(KEY, cap)
    assert verify(PUBLIC, text, NOW) == cap
    assert verify_capability(PUBLIC, text, NOW) == cap
    assert cap.expires == NOW + 600


def test_a_name_travels_whole() -> None:
    t = Token.new("équipe \"a\" ✓", {"read"}, ["/"], 60, NOW)
    assert verify(PUBLIC, sign(KEY, t), NOW).name == "équipe \"a\" ✓"


# -- every refusal -------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "stg1", "stg1.", "stg1..", "a.b.c.d", "stg1.e30",
                                  "x" * 10_000, "stg1." + "A" * 9000 + ".AA"])
def test_malformed_texts_are_refused(text: str) -> None:
    refused("malformed", text)


@pytest.mark.parametrize("text", [None, 12, b"stg1.a.b", ["stg1"]])
def test_what_is_not_a_string_is_refused(text: object) -> None:
    refused("malformed", text)  # type: ignore[arg-type]


def test_another_version_is_refused() -> None:
    good = sign(KEY, token())
    refused("version", "stg2" + good[4:])
    refused("version", "STG1" + good[4:])


def test_bad_base64_is_refused() -> None:
    good = sign(KEY, token())
    version, payload, signature = good.split(".")
    refused("malformed", f"{version}.{payload}+.{signature}")       # not the url alphabet
    refused("malformed", f"{version}.{payload}.{signature}=")       # padding
    refused("malformed", f"{version}.{payload}.{signature[:-1]}")   # signature too short
    # The last character of a 64-byte signature carries 4 unused bits: a lenient decoder
    # reads the same signature from 16 spellings.  Only the canonical one is accepted.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    used = alphabet.index(signature[-1]) >> 4
    twins = [c for i, c in enumerate(alphabet) if i >> 4 == used and c != signature[-1]]
    assert len(twins) == 15
    for c in twins:
        refused("malformed", f"{version}.{payload}.{signature[:-1]}{c}")


@pytest.mark.parametrize("payload", [b"{", b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
                                     b"[1, 2]", b'"token"', b"null", b"NaN"])
def test_bad_json_signed_by_our_key_is_refused(payload: bytes) -> None:
    refused("malformed", signed_payload(payload))


def _fields(claims: Token | Capability) -> dict[str, object]:
    return claims.to_json()


@pytest.mark.parametrize("change", [
    {"extra": 1}, {"typ": "admin"}, {"typ": None}, {"exp": 1.5}, {"exp": True},
    {"exp": "1"}, {"exp": -1}, {"id": "G" * 32}, {"id": "a" * 31}, {"scopes": "read"},
    {"scopes": []}, {"scopes": ["root"]}, {"scopes": [1]}, {"prefixes": []},
    {"prefixes": ["/a/../b"]}, {"prefixes": "/"}, {"prefixes": [None]}, {"name": 5},
    {"name": "a\nforged audit line"}, {"name": "x" * 201},
])
def test_unknown_fields_and_bad_token_values_are_refused(change: dict[str, object]) -> None:
    refused("malformed", signed_payload({**_fields(token()), **change}))


@pytest.mark.parametrize("change", [{"op": "delete"}, {"file": "x"}, {"holder": 1},
                                    {"scopes": ["read"]}, {"typ": "token"}])
def test_bad_capability_values_are_refused(change: dict[str, object]) -> None:
    refused("malformed", signed_payload({**_fields(Capability.new(FILE_A, "read", HOLDER,
                                                                  NOW)), **change}))


@pytest.mark.parametrize("missing", ["typ", "id", "name", "scopes", "prefixes", "exp"])
def test_a_missing_field_is_refused(missing: str) -> None:
    fields = _fields(token())
    del fields[missing]
    refused("malformed", signed_payload(fields))


def test_a_token_signed_by_another_key_is_refused() -> None:
    forged = sign(OTHER, token({"admin"}, ["/"]))
    refused("forged", forged)
    # The payload of a genuine token under another's signature, and the reverse.
    good = sign(KEY, token()).split(".")
    bad = forged.split(".")
    refused("forged", ".".join([good[0], bad[1], good[2]]))
    refused("forged", ".".join([good[0], good[1], bad[2]]))


def test_expiry_allows_the_clock_skew_and_no_more() -> None:
    text = sign(KEY, token(ttl=60))
    assert verify(PUBLIC, text, NOW + 60 + CLOCK_SKEW)
    err = refused("expired", text, NOW + 60 + CLOCK_SKEW + 1)
    assert str(err) == "token expired"
    cap = sign(KEY, Capability.new(FILE_A, "read", HOLDER, NOW, ttl=10))
    refused("expired", cap, NOW + 10 + CLOCK_SKEW + 0.5)


def test_a_revoked_token_is_refused_at_once() -> None:
    t = token()
    text = sign(KEY, t)
    revoked = MemoryRevocations()
    assert isinstance(revoked, Revocations)
    assert verify_token(PUBLIC, text, NOW, revoked) == t
    revoked.revoke(t.id)
    with pytest.raises(Unauthenticated) as info:
        verify_token(PUBLIC, text, NOW, revoked)
    assert info.value.details["reason"] == "revoked"


def test_a_capability_is_no_bearer_token_and_a_token_no_capability() -> None:
    cap = sign(KEY, Capability.new(FILE_A, "read", HOLDER, NOW))
    with pytest.raises(Unauthenticated) as info:
        verify_token(PUBLIC, cap, NOW, MemoryRevocations())
    assert info.value.details["reason"] == "wrong_type"
    with pytest.raises(Unauthenticated) as info:
        verify_capability(PUBLIC, sign(KEY, token({"admin"}, ["/"])), NOW)
    assert info.value.details["reason"] == "wrong_type"


def test_no_refusal_repeats_the_token_and_all_cross_the_wire() -> None:
    text = sign(OTHER, token())
    for bad in (text, text[:-2], "stg2" + text[4:], sign(KEY, token(ttl=1))):
        with pytest.raises(Unauthenticated) as info:
            verify(PUBLIC, bad, NOW + 3600)
        err = info.value
        body = json.dumps(err.to_json())
        assert bad not in body and bad.split(".")[1] not in body
        again = error_from_wire(err.status, body.encode())
        assert type(again) is Unauthenticated and isinstance(again, PermissionError)
        assert again.details == err.details


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_bit_flipped_anywhere_is_refused(data: st.DataObject) -> None:
    """Headers reach us as text; a flipped bit gives another text (latin-1 maps every byte)."""
    text = sign(KEY, data.draw(st.sampled_from(TEXTS)))
    raw = bytearray(text.encode("ascii"))
    position = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[position // 8] ^= 1 << (position % 8)
    with pytest.raises(Unauthenticated):
        verify(PUBLIC, raw.decode("latin-1"), NOW)


TEXTS = [token({"read", "write"}, ["/a", "/b/c"]), Capability.new(FILE_A, "read", HOLDER, NOW)]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.from_regex(r"stg1\.[A-Za-z0-9_-]{0,60}\.[A-Za-z0-9_=-]{0,90}",
                                          fullmatch=True)))
def test_any_text_is_refused_with_our_error_and_nothing_else(text: str) -> None:
    with pytest.raises(Unauthenticated):
        verify(PUBLIC, text, NOW)


# -- building claims -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"scopes": set()}, {"scopes": {"root"}}, {"scopes": "read"}, {"prefixes": []},
    {"prefixes": ["a/../b"]}, {"prefixes": "/a"}, {"name": "tab\there"},
])
def test_bad_token_fields_are_a_bad_request(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"name": "n", "scopes": {"read"}, "prefixes": ["/"],
                               "ttl": 60, "now": NOW}
    with pytest.raises(BadRequest):
        Token.new(**{**args, **kwargs})  # type: ignore[arg-type]


def test_bad_capability_fields_are_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        Capability.new("not-a-file-id", "read", HOLDER, NOW)
    with pytest.raises(BadRequest):
        Capability.new(FILE_A, "append", HOLDER, NOW)


# -- policy --------------------------------------------------------------------------------

def test_scopes_admin_implies_all_join_only_itself() -> None:
    admin, join = token({"admin"}, ["/"]), token({"join"}, ["/"])
    for scope in ("read", "write", "admin", "join"):
        assert allows(admin, scope, "/x") and allows(admin, scope, None)
    assert allows(join, "join", None)
    assert not any(allows(join, s, "/x") for s in ("read", "write", "admin"))
    reader = token({"read"}, ["/"])
    assert allows(reader, "read", "/x") and not allows(reader, "write", "/x")
    writer = token({"write"}, ["/"])
    assert allows(writer, "write", "/x") and not allows(writer, "read", "/x")


def test_cluster_wide_operations_need_a_token_for_everything() -> None:
    assert not allows(token({"admin"}, ["/team"]), "admin", None)
    assert allows(token({"admin"}, ["/team"]), "write", "/team/x")


def test_require_names_what_is_missing() -> None:
    t = token({"read"}, ["/data/a"])
    require(t, "read", "/data/a/x")
    with pytest.raises(Forbidden) as info:
        require(t, "write", "/data/a/x")
    assert info.value.status == 403 and info.value.details["scope"] == "write"
    with pytest.raises(Forbidden) as info:
        require(t, "read", "/data/ab")
    assert info.value.details["path"] == "/data/ab"
    with pytest.raises(Forbidden):
        require(t, "read", None)


def test_prefixes_match_at_segment_boundaries() -> None:
    t = token({"read"}, ["/data/a"])
    assert allows(t, "read", "/data/a") and allows(t, "read", "/data/a/x/y")
    assert not allows(t, "read", "/data/ab") and not allows(t, "read", "/data")
    assert visible(t, "/") and visible(t, "/data") and visible(t, "/data/a/x")
    assert not visible(t, "/data/ab") and not visible(t, "/other")
    assert not visible(token({"write"}, ["/data/a"]), "/data/a")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


SEGMENT = st.sampled_from(["a", "ab", "b", "a.b", "é"])
PATHS = st.lists(SEGMENT, max_size=4).map(lambda parts: "/" + "/".join(parts))


@settings(max_examples=400, deadline=None)
@given(PATHS, st.lists(PATHS, min_size=1, max_size=3))
def test_prefix_matching_agrees_with_a_reference(path: str, prefixes: list[str]) -> None:
    """Reference: compare path segments, never characters."""
    t = Token.new("n", {"read"}, prefixes, 60, NOW)
    covered = any(_parts(path)[:len(_parts(p))] == _parts(p) for p in prefixes)
    below = any(_parts(p)[:len(_parts(path))] == _parts(path) for p in prefixes)
    assert allows(t, "read", path) == covered
    assert visible(t, path) == (covered or below)


def test_a_capability_allows_its_own_file_and_operation_only() -> None:
    read = Capability.new(FILE_A, "read", HOLDER, NOW)
    write = Capability.new(FILE_A, "write", HOLDER, NOW)
    assert capability_allows(read, FILE_A, "read")
    assert not capability_allows(read, FILE_B, "read")
    assert not capability_allows(read, FILE_A, "write")
    assert not capability_allows(read, None, "cluster")
    assert capability_allows(write, FILE_A, "write")
    assert capability_allows(write, FILE_A, "read")      # reading back what it wrote
    assert not capability_allows(write, FILE_B, "read")
    assert not capability_allows(write, FILE_A, "cluster")
    require_capability(read, FILE_A, "read")
    with pytest.raises(Forbidden, match="another file"):
        require_capability(read, FILE_B, "read")
    with pytest.raises(Forbidden, match="read capability does not allow write"):
        require_capability(read, FILE_A, "write")


def test_a_server_capability_covers_every_file_on_its_one_target_only() -> None:
    cluster = Capability.new("*", "cluster", HOLDER, NOW, target="t0")
    assert verify(PUBLIC, sign(KEY, cluster), NOW) == cluster
    for op in ("read", "write", "cluster"):
        assert capability_allows(cluster, FILE_A, op, "t0")
        assert not capability_allows(cluster, FILE_A, op, "t1")     # another target
    assert capability_allows(cluster, None, "cluster", "t0")
    assert not capability_allows(cluster, None, "cluster", "t-rogue")
    with pytest.raises(Forbidden, match="another target"):
        require_capability(cluster, None, "cluster", "t1")
    read = Capability.new("*", "read", HOLDER, NOW, target="t0")
    assert capability_allows(read, FILE_A, "read", "t0")
    assert not capability_allows(read, None, "cluster", "t0")       # its operation only
    with pytest.raises(BadRequest):
        Capability.new(FILE_A, "cluster", HOLDER, NOW, target="t0")  # file "*" only
    for bad in (("*", "read", None), ("*", "cluster", None), (FILE_A, "read", "t0"),
                ("*", "read", "../t0")):
        with pytest.raises(BadRequest):                 # "*" needs a target, a file none
            Capability.new(bad[0], bad[1], HOLDER, NOW, target=bad[2])


def test_a_target_credential_names_one_target_and_has_no_other_scope() -> None:
    cred = Token.new("target:t0", {"target"}, ["/"], 60, NOW, target="t0")
    assert verify(PUBLIC, sign(KEY, cred), NOW) == cred
    assert acts_for(cred, "t0") and not acts_for(cred, "t1")
    for scope in ("read", "write", "join", "admin"):
        assert not allows(cred, scope, "/")
    for scopes, target in (({"target"}, None), ({"join"}, "t0"),
                           ({"target", "read"}, "t0")):
        with pytest.raises(BadRequest):
            Token.new("x", scopes, ["/"], 60, NOW, target=target)
    admin = Token.new("a", {"admin"}, ["/"], 60, NOW)
    assert acts_for(admin, "t0")
    assert not acts_for(Token.new("a", {"admin"}, ["/x"], 60, NOW), "t0")
    assert not acts_for(Token.new("j", {"join"}, ["/"], 60, NOW), "t0")


# -- the verified-capability cache ---------------------------------------------------------

def test_the_cache_verifies_each_text_once_and_still_refuses() -> None:
    cache = CapabilityCache(PUBLIC, size=2)
    texts = [sign(KEY, Capability.new(f, "read", HOLDER, NOW, ttl=60))
             for f in (FILE_A, FILE_B, "d" * 32)]
    assert cache.verify(texts[0], NOW).file_id == FILE_A
    assert cache.verify(texts[0], NOW).file_id == FILE_A
    assert (cache.hits, cache.misses) == (1, 1)
    forged = sign(OTHER, Capability.new(FILE_A, "read", HOLDER, NOW))
    for bad in (forged, texts[0][:-1], sign(KEY, token())):
        with pytest.raises(Unauthenticated):
            cache.verify(bad, NOW)
    assert len(cache) == 1                          # refusals are not remembered
    cache.verify(texts[1], NOW)
    cache.verify(texts[0], NOW)                     # texts[0] is now the most recent
    cache.verify(texts[2], NOW)                     # so texts[1] leaves
    assert len(cache) == 2 and cache.misses == 3 + 3
    cache.verify(texts[1], NOW)
    assert cache.misses == 7
    with pytest.raises(Unauthenticated) as info:    # a hit is checked for expiry too
        cache.verify(texts[1], NOW + 60 + CLOCK_SKEW + 1)
    assert info.value.details["reason"] == "expired"
    assert len(cache) == 1


def test_the_cache_is_bounded_by_the_bytes_of_its_texts() -> None:
    """Batch capabilities are ~30 times a file capability's text: a count alone would
    let a few thousand of them take hundreds of MB."""
    batches = [sign(KEY, Capability.batch([f"{i:04x}{j:028x}" for j in range(256)], "read",
                                          HOLDER, NOW, ttl=60)) for i in range(4)]
    assert len(batches[0]) > 7000
    cache = CapabilityCache(PUBLIC, size=100, max_bytes=2 * len(batches[0]) + 100)
    for text in batches:
        assert len(cache.verify(text, NOW).files) == 256
    assert len(cache) == 2 and cache.known(batches[3]) and not cache.known(batches[0])
    cache.forget(batches[3])
    cache.verify(batches[0], NOW)                   # room again for one more
    assert len(cache) == 2 and cache.known(batches[2])


# -- keys on disk --------------------------------------------------------------------------

def test_the_key_is_made_once_private_and_loaded_back(tmp_path: Path) -> None:
    directory = tmp_path / "root" / "auth"
    key = load_or_create_key(directory)
    path = directory / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert os.listdir(directory) == [KEY_FILE]              # no temporary file left
    again = load_or_create_key(directory)
    assert public_key_text(again) == public_key_text(key)
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    public, t = load_public_key(public_key_text(key)), token()
    assert verify(public, sign(again, t), NOW) == t
    with pytest.raises(FileExistsError):
        generate_key(path)
    assert public_key_text(load_key(path)) == public_key_text(key)


def test_a_key_other_users_may_read_is_refused(tmp_path: Path) -> None:
    load_or_create_key(tmp_path)
    path = tmp_path / KEY_FILE
    for mode in (0o640, 0o604, 0o644):
        path.chmod(mode)
        with pytest.raises(PermissionError, match="chmod 600"):
            load_or_create_key(tmp_path)
    path.chmod(0o600)
    load_key(path)


def test_a_key_file_that_is_not_an_ed25519_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / KEY_FILE
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(ValueError, match="not a PEM private key"):
        load_key(path)
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    with pytest.raises(ValueError, match="not an Ed25519 key"):
        load_key(path)


@pytest.mark.parametrize("text", ["", "abc", "A" * 44, "A" * 42 + "B", "A" * 42 + "!",
                                  "A" * 43 + "=", None])
def test_a_bad_public_key_is_a_clear_error(text: object) -> None:
    with pytest.raises(ValueError, match="43 base64url characters"):
        load_public_key(text)  # type: ignore[arg-type]


def test_the_public_key_text_round_trips() -> None:
    text = public_key_text(KEY)
    assert len(text) == 43 and public_key_text(PUBLIC) == text
    assert public_key_text(load_public_key(text + "\n")) == text
