"""The embedded metadata store: one SQLite file (:mod:`.store`)."""
