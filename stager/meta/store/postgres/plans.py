"""Schema migration 19 of the PostgreSQL store: its server-side functions stop planning
their statements again on every call (issue 30).

PL/pgSQL keeps a plan for each statement of a function, but where the statement has
parameters it plans it afresh with their values ("custom plans") for as long as those
come out cheaper than the generic one, and a ``dir_id = ANY(chain)`` over a known
two-element array always does: measured with pg_stat_statements (``track = all``,
``track_planning = on``) on a create through the client, the quota walk, the quota
charge, the manifests bump and the cached-bytes expression of ``stager_commit_values``
were planned on every create (~125 us of planning on a loaded machine, more than their
execution).  Every statement in these functions is a lookup by key, whose generic plan
is the custom one, so they are made to keep it (``plan_cache_mode`` for the call only;
the SET on the two entry points covers the functions they call).

``stager_spec_fields`` (migration 18) was a SQL function with a sub-select, which
PostgreSQL neither inlines nor keeps a plan for: each call planned its body again,
twice a create (~90 us).  It is the same function in PL/pgSQL now (its plan kept),
and a directory without a layout of its own, the usual case, answers at once.

Idempotent: CREATE OR REPLACE of a function drops its SET clauses, so a database set
back to an earlier version (tests do) loses them with 18 run again, and gains them here.
"""

from __future__ import annotations

# stager_put's and stager_commit's argument types (migrations 18 and 13-15)
_PUT_ARGS = ("TEXT, TEXT, TEXT, BOOLEAN, BOOLEAN, DOUBLE PRECISION, BIGINT, DOUBLE PRECISION, "
             "BYTEA, DOUBLE PRECISION, TEXT, TEXT")
_COMMIT_ARGS = "TEXT, BIGINT, DOUBLE PRECISION, BYTEA, DOUBLE PRECISION, TEXT"

GENERIC_PLANS = f"""
CREATE OR REPLACE FUNCTION stager_spec_fields(p_layout TEXT) RETURNS JSONB
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    j JSONB;
BEGIN
    IF p_layout IS NULL OR p_layout = '' THEN
        RETURN '{{}}'::jsonb;
    END IF;
    j := p_layout::jsonb;
    IF jsonb_typeof(j) <> 'object' THEN
        RETURN '{{}}'::jsonb;
    END IF;
    RETURN COALESCE((SELECT jsonb_object_agg(key, value) FROM jsonb_each(j)
                     WHERE key IN ('chunk_size', 'stripe_count', 'replicas')
                       AND value <> 'null'::jsonb), '{{}}'::jsonb);
END
$fn$;
ALTER FUNCTION stager_put({_PUT_ARGS}) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION stager_commit({_COMMIT_ARGS}) SET plan_cache_mode = force_generic_plan;
"""
