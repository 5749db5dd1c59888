"""Server-side functions of the PostgreSQL store (schema migration 5 in :mod:`.postgres.db`).

Each round trip to the database costs about as much as the work it carries on
this kind of machine (a bare ``SELECT 1`` is ~180 us), and a commit used to take
five or six in its transaction: take the upload off the pending ones, walk the
path, make missing parents, replace what is there, insert the file.
``stager_commit`` does all of that in one statement, so a commit is BEGIN, one
call and COMMIT.  It takes the steps the Python code took (the
walk and parents of :func:`.postgres.namespace.mkdirs`, the check of
:func:`.store.spec.check_replaceable`), in the same order; an error comes
back as a code and the path component it names, having changed nothing, and the
caller raises it.

The manifests ``gen`` bump of ancestor directories (schema 4) rides in the same
statement as the call when a batch has one commit (see
:func:`.postgres.uploads.commit_uploads`); a larger batch bumps them once at its end.
"""

from __future__ import annotations

COMMIT_FUNCTION = """
CREATE FUNCTION stager_commit(p_file_id TEXT, p_size BIGINT, p_mtime DOUBLE PRECISION,
                              p_checksums BYTEA, p_now DOUBLE PRECISION,
                              OUT r_err TEXT, OUT r_at TEXT, OUT r_path TEXT,
                              OUT r_layout TEXT)
LANGUAGE plpgsql AS $fn$
DECLARE
    up      uploads%ROWTYPE;
    names   TEXT[];
    n       INTEGER;
    cur     BIGINT := 1;
    walked  TEXT := '';
    e_id    BIGINT;
    e_kind  TEXT;
    e_fid   TEXT;
    e_lay   TEXT;
    e_size  BIGINT;
BEGIN
    -- Every check comes before the first change, so an error leaves nothing behind
    -- (a directory is made only past the last component that could fail, and what
    -- lies below a new one cannot): a group of writes needs no savepoint for it.
    SELECT * INTO up FROM uploads WHERE file_id = p_file_id;
    IF NOT FOUND THEN
        r_err := 'upload';
        RETURN;
    END IF;
    r_path := up.path;
    r_layout := up.layout;
    names := string_to_array(substr(up.path, 2), '/');
    n := cardinality(names);
    -- the parent directories, made where missing (as pg_namespace.mkdirs)
    FOR i IN 1 .. n - 1 LOOP
        walked := walked || '/' || names[i];
        SELECT id, kind INTO e_id, e_kind FROM entries WHERE parent = cur AND name = names[i];
        IF NOT FOUND THEN
            IF i < n - 1 AND NOT up.parents THEN
                r_err := 'noparent';
                r_at := walked;
                RETURN;
            END IF;
            INSERT INTO entries (parent, name, kind, mtime)
                VALUES (cur, names[i], 'directory', p_now) RETURNING id INTO e_id;
            UPDATE entries SET mtime = p_now WHERE id = cur;
        ELSIF e_kind <> 'directory' THEN
            r_err := CASE WHEN i = n - 1 THEN 'fileparent' ELSE 'notdir' END;
            r_at := walked;
            RETURN;
        END IF;
        cur := e_id;
    END LOOP;
    -- what is already there (as store/spec.py check_replaceable)
    SELECT id, kind, file_id, layout, size INTO e_id, e_kind, e_fid, e_lay, e_size
        FROM entries WHERE parent = cur AND name = names[n];
    IF FOUND THEN
        IF e_kind = 'directory' THEN
            r_err := 'isdir';
            RETURN;
        END IF;
        IF NOT up.overwrite THEN
            r_err := 'exists';
            RETURN;
        END IF;
        INSERT INTO garbage VALUES (e_fid, e_lay, e_size, p_now) ON CONFLICT (file_id)
            DO UPDATE SET layout = EXCLUDED.layout, size = EXCLUDED.size,
                          since = EXCLUDED.since;
        DELETE FROM entries WHERE id = e_id;
    END IF;
    DELETE FROM uploads WHERE file_id = p_file_id;
    UPDATE entries SET mtime = p_now WHERE id = cur;
    INSERT INTO entries (parent, name, kind, size, mtime, file_id, layout, checksums)
        VALUES (cur, names[n], 'file', p_size, p_mtime, p_file_id, up.layout, p_checksums);
END
$fn$;
"""

# Schema migration 6: writes whose loss in a crash of the database costs nothing that
# was promised, committed without waiting for their WAL flush (``synchronous_commit``
# off for their own transaction only; PostgreSQL still keeps them consistent, and a
# later durable commit flushes them with it).  Each is one statement, so it runs as a
# transaction of its own, and may run twice (after a lost connection): ON CONFLICT.
#
# - ``stager_reserve``: a pending upload.  Nothing of it is visible, and its commit,
#   which takes the row away, is durable and flushes the row's WAL with its own; a
#   crash of the database within ~0.6 s of the reservation (three ``wal_writer_delay``)
#   can lose it, and then that commit fails with "upload not found", having changed
#   nothing: the writer writes the file again, and the chunks already written become
#   orphans that fsck collects after ``orphan_grace``.
# - ``stager_record_answer``: the answer to a keyed request, recorded after its
#   operation committed (durably); it only spares a retry the work of finding what
#   the first try did, and one lost in a crash is the same as a server that died
#   before recording it (see stager/meta/opkey.py).
LAZY_FUNCTIONS = """
CREATE FUNCTION stager_reserve(p_file_id TEXT, p_path TEXT, p_layout TEXT,
                               p_overwrite BOOLEAN, p_parents BOOLEAN,
                               p_created DOUBLE PRECISION) RETURNS BOOLEAN
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO uploads (file_id, path, layout, overwrite, parents, created)
        VALUES (p_file_id, p_path, p_layout, p_overwrite, p_parents, p_created)
        ON CONFLICT (file_id) DO NOTHING;
    RETURN FOUND;
END
$fn$;
CREATE FUNCTION stager_record_answer(p_key TEXT, p_status INTEGER, p_body BYTEA,
                                     p_created DOUBLE PRECISION) RETURNS BOOLEAN
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO answers (key, status, body, created)
        VALUES (p_key, p_status, p_body, p_created) ON CONFLICT (key) DO NOTHING;
    RETURN FOUND;
END
$fn$;
"""

# Schema migration 9: stager_commit charges the quotas above the file (stager/meta/quotas.py)
# in its one statement.  The walk stops at the first missing parent, so that every check
# (the quotas last) comes before the first change, as in COMMIT_FUNCTION; a refused
# commit answers 'quota_bytes' or 'quota_files' with the quota directory's row id, its
# limit, its use and what the write needed.
QUOTA_COMMIT_FUNCTION = """
DROP FUNCTION stager_commit(TEXT, BIGINT, DOUBLE PRECISION, BYTEA, DOUBLE PRECISION);
CREATE FUNCTION stager_commit(p_file_id TEXT, p_size BIGINT, p_mtime DOUBLE PRECISION,
                              p_checksums BYTEA, p_now DOUBLE PRECISION,
                              OUT r_err TEXT, OUT r_at TEXT, OUT r_path TEXT,
                              OUT r_layout TEXT, OUT r_limit BIGINT, OUT r_use BIGINT,
                              OUT r_need BIGINT)
LANGUAGE plpgsql AS $fn$
DECLARE
    up      uploads%ROWTYPE;
    names   TEXT[];
    n       INTEGER;
    cur     BIGINT := 1;
    chain   BIGINT[] := ARRAY[1::BIGINT];
    missing INTEGER := 0;
    walked  TEXT := '';
    e_id    BIGINT;
    e_kind  TEXT;
    old_id  BIGINT;
    e_fid   TEXT;
    e_lay   TEXT;
    e_size  BIGINT := 0;
    d_bytes BIGINT;
    d_files BIGINT;
    q       quotas%ROWTYPE;
BEGIN
    SELECT * INTO up FROM uploads WHERE file_id = p_file_id;
    IF NOT FOUND THEN
        r_err := 'upload';
        RETURN;
    END IF;
    r_path := up.path;
    r_layout := up.layout;
    names := string_to_array(substr(up.path, 2), '/');
    n := cardinality(names);
    -- the parent directories there already; the first missing one ends the walk
    FOR i IN 1 .. n - 1 LOOP
        walked := walked || '/' || names[i];
        SELECT id, kind INTO e_id, e_kind FROM entries WHERE parent = cur AND name = names[i];
        IF NOT FOUND THEN
            IF i < n - 1 AND NOT up.parents THEN
                r_err := 'noparent';
                r_at := walked;
                RETURN;
            END IF;
            missing := i;
            EXIT;
        ELSIF e_kind <> 'directory' THEN
            r_err := CASE WHEN i = n - 1 THEN 'fileparent' ELSE 'notdir' END;
            r_at := walked;
            RETURN;
        END IF;
        cur := e_id;
        chain := chain || e_id;
    END LOOP;
    -- what is already there (as store/spec.py check_replaceable)
    IF missing = 0 THEN
        SELECT id, kind, file_id, layout, size INTO old_id, e_kind, e_fid, e_lay, e_size
            FROM entries WHERE parent = cur AND name = names[n];
        IF FOUND THEN
            IF e_kind = 'directory' THEN
                r_err := 'isdir';
                RETURN;
            END IF;
            IF NOT up.overwrite THEN
                r_err := 'exists';
                RETURN;
            END IF;
        ELSE
            e_size := 0;
        END IF;
    END IF;
    -- the quotas above: refused before any change, else charged
    d_bytes := p_size - e_size;
    d_files := CASE WHEN old_id IS NULL THEN 1 ELSE 0 END;
    IF d_bytes <> 0 OR d_files <> 0 THEN
        FOR q IN SELECT * FROM quotas WHERE dir_id = ANY(chain) ORDER BY dir_id LOOP
            IF d_bytes > 0 AND q.max_bytes IS NOT NULL
                    AND q.used_bytes + d_bytes > q.max_bytes THEN
                r_err := 'quota_bytes';
                r_limit := q.max_bytes;
                r_use := q.used_bytes;
                r_need := d_bytes;
            ELSIF d_files > 0 AND q.max_files IS NOT NULL
                    AND q.used_files + d_files > q.max_files THEN
                r_err := 'quota_files';
                r_limit := q.max_files;
                r_use := q.used_files;
                r_need := d_files;
            END IF;
            IF r_err IS NOT NULL THEN
                r_at := q.dir_id::TEXT;
                RETURN;
            END IF;
        END LOOP;
        UPDATE quotas SET used_bytes = used_bytes + d_bytes, used_files = used_files + d_files
            WHERE dir_id = ANY(chain);
    END IF;
    IF old_id IS NOT NULL THEN
        INSERT INTO garbage VALUES (e_fid, e_lay, e_size, p_now) ON CONFLICT (file_id)
            DO UPDATE SET layout = EXCLUDED.layout, size = EXCLUDED.size,
                          since = EXCLUDED.since;
        DELETE FROM entries WHERE id = old_id;
    END IF;
    -- the missing parent directories, made (nothing below a new one can fail)
    IF missing > 0 THEN
        FOR i IN missing .. n - 1 LOOP
            INSERT INTO entries (parent, name, kind, mtime)
                VALUES (cur, names[i], 'directory', p_now) RETURNING id INTO e_id;
            UPDATE entries SET mtime = p_now WHERE id = cur;
            cur := e_id;
        END LOOP;
    END IF;
    DELETE FROM uploads WHERE file_id = p_file_id;
    UPDATE entries SET mtime = p_now WHERE id = cur;
    INSERT INTO entries (parent, name, kind, size, mtime, file_id, layout, checksums)
        VALUES (cur, names[n], 'file', p_size, p_mtime, p_file_id, up.layout, p_checksums);
END
$fn$;
"""

# Schema migration 13: a file version's attributes (S3's ETag, Content-Type, …) are set
# by its commit, in the same one statement.  The body is migration 9's with the new
# argument and column, derived from it so that the two cannot drift apart.
_INSERT_FILE = ("INSERT INTO entries (parent, name, kind, size, mtime, file_id, layout, "
                "checksums)\n"
                "        VALUES (cur, names[n], 'file', p_size, p_mtime, p_file_id, up.layout, "
                "p_checksums);")
_HEAD = "p_checksums BYTEA, p_now DOUBLE PRECISION,\n"
assert QUOTA_COMMIT_FUNCTION.count(_INSERT_FILE) == 1 and QUOTA_COMMIT_FUNCTION.count(_HEAD) == 1
# Idempotent, as migrations 10 to 12 are: a database set back to an earlier version
# (tests do) runs it again over its own result.
ATTRS_COMMIT_FUNCTION = "ALTER TABLE entries ADD COLUMN IF NOT EXISTS attrs TEXT;\n" + (
    QUOTA_COMMIT_FUNCTION
    .replace("DROP FUNCTION stager_commit(", "DROP FUNCTION IF EXISTS stager_commit(")
    .replace("CREATE FUNCTION stager_commit(", "CREATE OR REPLACE FUNCTION stager_commit(")
    .replace(_HEAD, "p_checksums BYTEA, p_now DOUBLE PRECISION, p_attrs TEXT,\n")
    .replace(_INSERT_FILE, _INSERT_FILE.replace("layout, checksums)", "layout, checksums, attrs)")
             .replace("p_checksums);", "p_checksums, p_attrs);")))

# Schema migration 14: a file of an attached directory counts against the quotas above
# it by its filled bytes only (stager/meta/quotas.py), charged by each fill: its commit
# charges 0 bytes, and an overwritten or replaced cached file refunds its filled bytes,
# not its size.  Migration 13's body with that one change; idempotent like it.
_CHARGE = "    d_bytes := p_size - e_size;\n"
assert ATTRS_COMMIT_FUNCTION.count(_CHARGE) == 1
CACHED_COMMIT_FUNCTION = ATTRS_COMMIT_FUNCTION.replace(_CHARGE, """\
    d_bytes := CASE WHEN (up.layout::jsonb ->> 'cached')::boolean THEN 0 ELSE p_size END
        - CASE WHEN old_id IS NOT NULL AND (e_lay::jsonb ->> 'cached')::boolean
               THEN (SELECT COALESCE(SUM(c.size), 0) FROM cache_chunks c
                     WHERE c.file_id = e_fid AND c.crc IS NOT NULL)
               ELSE e_size END;
""")

# Schema migration 15: a commit of a file id over the row of that same id (a keyed PUT
# sent twice as a first try: aiohttp re-sends a PUT when its keep-alive connection
# drops) replaces the row only.  As garbage, the id's chunks (the new row's too) would
# be purged and the file left unreadable.  Migration 14's body with that one change.
_GARBAGE = ("        INSERT INTO garbage VALUES (e_fid, e_lay, e_size, p_now) "
            "ON CONFLICT (file_id)\n"
            "            DO UPDATE SET layout = EXCLUDED.layout, size = EXCLUDED.size,\n"
            "                          since = EXCLUDED.since;\n")
assert CACHED_COMMIT_FUNCTION.count(_GARBAGE) == 1
SELF_COMMIT_FUNCTION = CACHED_COMMIT_FUNCTION.replace(
    _GARBAGE, "        IF e_fid IS DISTINCT FROM p_file_id THEN\n" + _GARBAGE + "        END IF;\n")

# Schema migration 16: an upload begun and committed in one statement (a small file's
# gateway PUT, whose record waits for its one chunk: :mod:`.postgres.group` joins the
# record and the commit queued right behind it).  The row is inserted as
# ``begin_uploads`` inserts it (a file id already pending is an error), without
# ``stager_reserve``'s lazy flush: its commit is durable.  Idempotent.
# stager_put's signature in migrations 16 and 17 (18 adds p_spec to it)
_PUT_SIGNATURE = """\
CREATE OR REPLACE FUNCTION stager_put(p_file_id TEXT, p_path TEXT, p_layout TEXT,
                                      p_overwrite BOOLEAN, p_parents BOOLEAN,
                                      p_created DOUBLE PRECISION, p_size BIGINT,
                                      p_mtime DOUBLE PRECISION, p_checksums BYTEA,
                                      p_now DOUBLE PRECISION, p_attrs TEXT,
                                      OUT r_err TEXT, OUT r_at TEXT, OUT r_path TEXT,
                                      OUT r_layout TEXT, OUT r_limit BIGINT,
                                      OUT r_use BIGINT, OUT r_need BIGINT)
"""
PUT_FUNCTION = "\n" + _PUT_SIGNATURE + """\
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO uploads (file_id, path, layout, overwrite, parents, created)
        VALUES (p_file_id, p_path, p_layout, p_overwrite, p_parents, p_created);
    SELECT * INTO r_err, r_at, r_path, r_layout, r_limit, r_use, r_need
        FROM stager_commit(p_file_id, p_size, p_mtime, p_checksums, p_now, p_attrs);
END
$fn$;
"""

# Schema migration 17: stager_put without the upload's row where its commit succeeds.
# Migration 16 inserted the row and had stager_commit read it back and delete it, in
# the same statement: a heap tuple, two index entries and a delete, all written to
# the WAL, for a row no other transaction could ever see; and the statement walked
# the path once more, in SQL around the call, to bump the manifests above it.
# ``stager_commit_values`` is migration 15's commit with the upload given as values
# (derived from it, as 13 to 15 are from 9), bumping those manifests itself once
# every check has passed (the directories its walk found: the ones a manifest can be
# on).  stager_put inserts the row only where the commit is refused, so that the
# upload is then pending as after a begin and a failed commit (the caller aborts it,
# or a quota refusal's abort moves it to the garbage); an id already pending fails
# as the begin of it does, with the insert's own error.  Idempotent.
_TAKE_UPLOAD = """\
    SELECT * INTO up FROM uploads WHERE file_id = p_file_id;
    IF NOT FOUND THEN
        r_err := 'upload';
        RETURN;
    END IF;
"""
_GIVEN_UPLOAD = """\
    up.file_id := p_file_id;
    up.path := p_path;
    up.layout := p_layout;
    up.overwrite := p_overwrite;
    up.parents := p_parents;
"""
_DROP_UPLOAD = "    DELETE FROM uploads WHERE file_id = p_file_id;\n"
_BUMP_CHAIN = "    UPDATE manifests SET gen = gen + 1 WHERE dir_id = ANY(chain);\n"
_COMMIT_HEAD = "CREATE OR REPLACE FUNCTION stager_commit(p_file_id TEXT, p_size BIGINT,"
_BODY = SELF_COMMIT_FUNCTION[SELF_COMMIT_FUNCTION.index(_COMMIT_HEAD):]
assert all(_BODY.count(s) == 1 for s in (_TAKE_UPLOAD, _DROP_UPLOAD, _COMMIT_HEAD))
COMMIT_VALUES_FUNCTION = (
    _BODY.replace(_COMMIT_HEAD, "CREATE OR REPLACE FUNCTION stager_commit_values("
                  "p_file_id TEXT, p_path TEXT, p_layout TEXT,\n"
                  "                              p_overwrite BOOLEAN, p_parents BOOLEAN, "
                  "p_size BIGINT,")
    .replace(_TAKE_UPLOAD, _GIVEN_UPLOAD).replace(_DROP_UPLOAD, _BUMP_CHAIN))
DIRECT_PUT_FUNCTION = COMMIT_VALUES_FUNCTION + "\n" + _PUT_SIGNATURE + """\
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM uploads WHERE file_id = p_file_id;
    IF NOT FOUND THEN
        SELECT * INTO r_err, r_at, r_path, r_layout, r_limit, r_use, r_need
            FROM stager_commit_values(p_file_id, p_path, p_layout, p_overwrite, p_parents,
                                      p_size, p_mtime, p_checksums, p_now, p_attrs);
        IF r_err IS NULL THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO uploads (file_id, path, layout, overwrite, parents, created)
        VALUES (p_file_id, p_path, p_layout, p_overwrite, p_parents, p_created);
END
$fn$;
"""

# Schema migration 18: stager_put checks the directory layout its put was planned with
# (``p_spec``: the spec a gateway PUT assumed without the check of its path, see
# stager/meta/writes.py plan_hinted; NULL where it was checked).  Its walk merges the
# ``layout`` of the directories above the file, the nearest winning field by field (as
# postgres/namespace.py inherited); where that is not ``p_spec`` it answers 'spec', that
# spec in r_layout, having changed nothing (not even the upload's row: the writer plans
# and writes again).  Otherwise migration 17's put.  Idempotent: 17 run again makes its
# overload of eleven arguments again, which this drops.
_PUT_HEAD = "p_now DOUBLE PRECISION, p_attrs TEXT,\n"
_PUT_BEGIN = ("LANGUAGE plpgsql AS $fn$\nBEGIN\n"
              "    PERFORM 1 FROM uploads WHERE file_id = p_file_id;\n")
_PUT = DIRECT_PUT_FUNCTION[DIRECT_PUT_FUNCTION.index("CREATE OR REPLACE FUNCTION stager_put("):]
assert _PUT.count(_PUT_HEAD) == 1 and _PUT.count(_PUT_BEGIN) == 1
SPEC_PUT_FUNCTION = """
DROP FUNCTION IF EXISTS stager_put(TEXT, TEXT, TEXT, BOOLEAN, BOOLEAN, DOUBLE PRECISION,
                                   BIGINT, DOUBLE PRECISION, BYTEA, DOUBLE PRECISION, TEXT);
CREATE OR REPLACE FUNCTION stager_spec_fields(p_layout TEXT) RETURNS JSONB
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE WHEN p_layout IS NULL OR p_layout = '' THEN '{}'::jsonb
                WHEN jsonb_typeof(p_layout::jsonb) <> 'object' THEN '{}'::jsonb
                ELSE COALESCE((SELECT jsonb_object_agg(key, value)
                               FROM jsonb_each(p_layout::jsonb)
                               WHERE key IN ('chunk_size', 'stripe_count', 'replicas')
                                 AND value <> 'null'::jsonb), '{}'::jsonb) END
$fn$;
""" + _PUT.replace(_PUT_HEAD, "p_now DOUBLE PRECISION, p_attrs TEXT, p_spec TEXT,\n").replace(
    _PUT_BEGIN, """\
LANGUAGE plpgsql AS $fn$
DECLARE
    names   TEXT[];
    cur     BIGINT := 1;
    spec    JSONB;
    e_id    BIGINT;
    e_kind  TEXT;
    e_lay   TEXT;
BEGIN
    IF p_spec IS NOT NULL THEN
        SELECT layout INTO e_lay FROM entries WHERE id = cur;
        spec := stager_spec_fields(e_lay);
        names := string_to_array(substr(p_path, 2), '/');
        FOR i IN 1 .. cardinality(names) - 1 LOOP
            SELECT id, kind, layout INTO e_id, e_kind, e_lay
                FROM entries WHERE parent = cur AND name = names[i];
            EXIT WHEN NOT FOUND OR e_kind <> 'directory';
            spec := spec || stager_spec_fields(e_lay);
            cur := e_id;
        END LOOP;
        IF spec <> p_spec::jsonb THEN
            r_err := 'spec';
            r_path := p_path;
            r_layout := spec::text;
            RETURN;
        END IF;
    END IF;
    PERFORM 1 FROM uploads WHERE file_id = p_file_id;
""")
