"""Metadata stores: the one interface (:mod:`.base`), SQLite and PostgreSQL, and
copying a namespace between them (:mod:`.migrate`)."""
