"""The fast tier as a managed cache: attached directories, filled on read, evicted by policy.

- :mod:`.attach`: ``stager attach SRC DST``: a directory made a view of a source URL,
  its listing kept as committed files whose layouts say ``cached``; a refresh lists
  the source again (a changed file gets a new file id: its old bytes are never
  served mixed with new ones), ``detach`` forgets the view and frees its bytes.
- :mod:`.fill`: a reader's ``fill`` request: each missing chunk fetched from the
  source by one metadata server (a lease per chunk in the store), written to the
  chunk's targets, its CRC32C recorded; every other reader, here or on another
  metadata server, waits for that one fetch.
- :mod:`.evict`: the duty holder keeps filled bytes under ``cache_limit`` with the
  eviction policy named by ``cache_policy`` (:mod:`stager.eviction`).
- :mod:`.secrets`: the sources' storage options, encrypted at rest.
"""
