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
