"""S3's errors: one table, code ↔ HTTP status, and the XML body S3 clients parse.

Everything the gateway refuses is an :class:`S3Error`; stager's own errors
(``stager.errors``) are mapped onto S3 codes in one place (:func:`from_stager`).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

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
    "InvalidPartOrder": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
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
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "XAmzContentSHA256Mismatch": 400,
    "BadGateway": 502,
    "InsufficientStorage": 507,
}


class S3Error(Exception):
    """An S3 error answer: ``code`` names it (a key of :data:`STATUS`)."""

    def __init__(self, code: str, message: str, *, resource: str = "",
                 status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.resource = resource
        self.status = status if status is not None else STATUS.get(code, 400)

    def xml(self, request_id: str) -> bytes:
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                f"<Code>{escape(self.code)}</Code><Message>{escape(self.message)}</Message>"
                f"<Resource>{escape(self.resource)}</Resource>"
                f"<RequestId>{escape(request_id)}</RequestId></Error>").encode()
