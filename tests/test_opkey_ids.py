"""A keyed create's file id (stager/meta/opkey.py): every try of it, on whichever server
and version, derives the same id from the key and the path."""

from __future__ import annotations

import contextvars
import uuid

from stager.meta import opkey

PATHS = ["/a", "/floors/plain/f1", "/" + "x" * 300 + "/é/ü", "/"]


def test_a_keyed_create_names_the_uuid5_of_its_key_and_path() -> None:
    def ids() -> list[str]:
        opkey.bind("key-1", retried=False)
        return [opkey.new_file_id(p) for p in PATHS]

    assert contextvars.copy_context().run(ids) == [
        uuid.uuid5(uuid.NAMESPACE_URL, f"key-1\0{p}").hex for p in PATHS]


def test_an_unkeyed_create_names_a_random_id() -> None:
    a, b = (contextvars.copy_context().run(opkey.new_file_id, "/a") for _ in range(2))
    assert a != b and uuid.UUID(a).version == 4
