"""Any fsspec URL read as a source: staging copies from one (``stage/``, ``client/``),
an attached directory is filled from one (``meta/cache``).  Below both the client and
the servers, so that neither imports the other to read a source."""
