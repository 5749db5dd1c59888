"""S3's errors: one table, code ↔ HTTP status, and the XML body S3 clients parse.

Everything the gateway refuses is an :class:`S3Error`; stager's own errors
(``stager.errors``) are mapped onto S3 codes in one place (:func:`from_stager`).
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from aiohttp.http_exceptions import (
    ContentLengthError,
    HttpProcessingError,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)

from ..errors import StagerError
from ..web.parseerrors import parser_message

# code -> HTTP status, as Amazon S3 answers them
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "BadDigest": 400,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "ExpiredToken": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartNumber": 416,
    "InvalidPartOrder": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "InvalidURI": 400,
    "KeyTooLongError": 400,
    "MalformedXML": 400,
    "MetadataTooLarge": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "NotImplemented": 501,
    "PreconditionFailed": 412,
    "RequestHeaderSectionTooLarge": 400,
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "XAmzContentSHA256Mismatch": 400,
    "BadGateway": 502,
    "InsufficientStorage": 507,
}


# What XML 1.0 cannot carry at all, escaped or not: an answer holding one is no XML
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` as XML character data: escaped, and each character XML 1.0 cannot
    carry (a control character echoed from a request, ``U+FFFE``) replaced by
    ``U+FFFD``, so every answer is one any XML parser reads."""
    return escape(_NOT_XML.sub("\ufffd", text))


def is_xml_text(text: str) -> bool:
    """Whether XML 1.0 can carry ``text`` as it is (a key it cannot could be listed
    only garbled)."""
    return _NOT_XML.search(text) is None


class S3Error(Exception):
    """An S3 error answer: ``code`` names it (a key of :data:`STATUS`)."""

    def __init__(self, code: str, message: str, *, resource: str = "",
                 status: int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.resource = resource
        self.headers = dict(headers or {})      # more headers of the answer
        self.status = status if status is not None else STATUS.get(code, 400)

    def xml(self, request_id: str) -> bytes:
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                f"<Code>{xml_text(self.code)}</Code><Message>{xml_text(self.message)}</Message>"
                f"<Resource>{xml_text(self.resource)}</Resource>"
                f"<RequestId>{xml_text(request_id)}</RequestId></Error>").encode()


# stager's wire codes (stager.errors) -> S3 codes; one home for the mapping
_FROM_STAGER: dict[str, str] = {
    "bad_request": "InvalidArgument",
    "invalid_path": "InvalidArgument",
    "invalid_layout": "InvalidArgument",
    "checksum_mismatch": "BadDigest",
    "not_found": "NoSuchKey",
    "upload_not_found": "NoSuchUpload",
    "method_not_allowed": "MethodNotAllowed",
    "exists": "InvalidRequest",
    "is_a_directory": "InvalidRequest",
    "not_a_directory": "InvalidRequest",
    "not_empty": "BucketNotEmpty",
    "unauthenticated": "AccessDenied",
    "forbidden": "AccessDenied",
    "read_only": "AccessDenied",
    "too_large": "EntityTooLarge",
    "range_not_satisfiable": "InvalidRange",
    "no_space": "InsufficientStorage",
    "quota_exceeded": "InsufficientStorage",
    "source_error": "BadGateway",
    "unavailable": "ServiceUnavailable",
    "no_targets": "ServiceUnavailable",
    "target_unavailable": "ServiceUnavailable",
}


def from_stager(exc: StagerError, resource: str = "") -> S3Error:
    """The S3 answer to a stager error (an unknown code is S3's ``InternalError``)."""
    return S3Error(_FROM_STAGER.get(exc.code, "InternalError"), exc.message, resource=resource)


# aiohttp's parser's refusals (stager/web/parseerrors.py) -> S3 codes, by class
_FROM_PARSER: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, "RequestHeaderSectionTooLarge"),
    (InvalidURLError, "InvalidURI"),
    ((ContentLengthError, TransferEncodingError), "IncompleteBody"),    # type: ignore[arg-type]
)


def from_parser(exc: HttpProcessingError) -> S3Error:
    """The S3 answer to a request that is not valid HTTP/1.1 (``InvalidRequest`` but
    for a line over the limit, a bad URI or a body cut short)."""
    code = next((c for kinds, c in _FROM_PARSER if isinstance(exc, kinds)), "InvalidRequest")
    return S3Error(code, f"malformed HTTP request: {parser_message(exc)}")
