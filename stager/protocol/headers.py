"""Header names of the stager protocol."""

CRC32C = "X-Stager-Crc32c"          # hex CRC32C of a chunk's bytes (PUT: of the body)
CHUNK_SIZE = "X-Stager-Chunk-Size"  # full size of the chunk a ranged GET reads from
TARGET = "X-Stager-Target"          # id of the target that served the request
AUTHORIZATION = "Authorization"     # "Bearer <token>" to the metadata server
CAPABILITY = "X-Stager-Capability"  # capabilities to a data server, space separated
FILE_ID = "X-Stager-File-Id"
# A client's key for one mutating request to the metadata server, the same on every
# retry of it; a server that has an answer for the key gives that instead of acting again.
IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "X-Stager-Replayed"      # "1" on an answer given again for a known key
ATTEMPT = "X-Stager-Attempt"        # which try of the keyed request this is: 1, 2, …


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip (``gzip`` or ``*``, not ``q=0``)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip", "*"):
            quality = params.strip().lower()
            return not (quality.startswith("q=") and float(quality[2:] or 0) == 0)
    return False


def etag_matches(if_none_match: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` value names ``etag`` (weak comparison, RFC 9110)."""
    def opaque(tag: str) -> str:
        tag = tag.strip()
        return tag[2:] if tag.startswith("W/") else tag

    return any(t.strip() == "*" or opaque(t) == opaque(etag) for t in if_none_match.split(","))
