"""S3's XML: the answers the gateway writes and the one request body it reads.

Answers are built from nested ``(tag, content)`` values by :func:`document`, so
every text is escaped in one place (:func:`~stager.s3.errors.xml_text`).  Request
bodies (DeleteObjects, CompleteMultipartUpload, CreateBucketConfiguration) are read
by :func:`parse` with the standard library's expat parser, as UTF-8 only and after
refusing any DTD (no entity can be declared, so none can expand).  UTF-8 first:
the DTD check reads the text, and a body in UTF-16 (which an XML declaration may
name) would slip a ``<!DOCTYPE`` past a check of the bytes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from datetime import UTC, datetime
from email.utils import formatdate

from .errors import S3Error, xml_text

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_BODY = 2 << 20          # a DeleteObjects body of 1,000 keys is well under this
MAX_DELETE = 1000

Node = tuple[str, "Content"] | None
Content = str | int | bool | Iterable[Node] | None


def iso(ts: float) -> str:
    """S3's timestamps in listings: ISO 8601 with milliseconds, UTC."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def http_date(ts: float) -> str:
    """RFC 7231 date (``Last-Modified``)."""
    return formatdate(ts, usegmt=True)


def _render(node: Node, out: list[str]) -> None:
    if node is None:
        return
    tag, content = node
    out.append(f"<{tag}>")
    if isinstance(content, bool):
        out.append("true" if content else "false")
    elif isinstance(content, (str, int)):
        out.append(xml_text(str(content)))
    elif content is not None:
        for child in content:
            _render(child, out)
    out.append(f"</{tag}>")


def document(root: str, children: Iterable[Node]) -> bytes:
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n', f'<{root} xmlns="{NS}">']
    for child in children:
        _render(child, out)
    out.append(f"</{root}>")
    return "".join(out).encode()


def parse(body: bytes, root: str) -> ET.Element:
    """A small XML request body whose root is ``root`` (namespace ignored)."""
    if len(body) > MAX_BODY:
        raise S3Error("MalformedXML", "the XML body is too large")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise S3Error("MalformedXML", "the XML body is not UTF-8") from None
    if "<!DOCTYPE" in text.upper() or "<!ENTITY" in text.upper():
        raise S3Error("MalformedXML", "a DTD is not allowed")
    try:
        # parsed as text: the declaration's encoding (UTF-16, or one Python does not
        # know, a LookupError) has no say any more
        elem = ET.fromstring(text)
    except (ET.ParseError, ValueError, LookupError) as exc:
        raise S3Error("MalformedXML", f"the XML is not well-formed: {exc}") from None
    if local(elem.tag) != root:
        raise S3Error("MalformedXML", f"the XML's root is not {root}")
    return elem


def local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def children(elem: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in elem if local(c.tag) == name]


def text_of(elem: ET.Element, name: str) -> str | None:
    found = children(elem, name)
    return (found[0].text or "") if found else None


def parse_delete(body: bytes) -> tuple[list[str], bool]:
    """DeleteObjects' body: the keys (in order) and ``Quiet``."""
    root = parse(body, "Delete")
    quiet = (text_of(root, "Quiet") or "").strip().lower() == "true"
    keys = []
    for obj in children(root, "Object"):
        key = text_of(obj, "Key")
        if key is None:
            raise S3Error("MalformedXML", "an Object without a Key")
        keys.append(key)
    if not keys:
        raise S3Error("MalformedXML", "no Object to delete")
    if len(keys) > MAX_DELETE:
        raise S3Error("MalformedXML", f"more than {MAX_DELETE} keys")
    return keys, quiet
