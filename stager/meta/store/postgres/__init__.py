"""The networked metadata store: PostgreSQL through asyncpg (:mod:`.store`)."""
