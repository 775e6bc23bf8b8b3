-- 0004: search: exact statistics declared per document type.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- The search functions themselves live in sql/idempotent/30_search.sql.

-- A document type's statistics: a SELECT returning one jsonb value, computed over a CTE named
-- `hits` that holds the chunks of this type matching a search's filter (every matching chunk,
-- not the top k). It reads the source tables through the chunks' source keys and metadata, so
-- the numbers are exact. Declared with pgrag.declare_stats(doc_type, stats_sql).
create table pgrag.doc_stats (
    doc_type text primary key references pgrag.doc_types (name) on delete cascade,
    stats_sql text not null check (stats_sql <> ''),
    updated_at timestamptz not null default now()
);

comment on table pgrag.doc_stats is
    'Per document type: a SELECT over the CTE `hits` (matching chunks) returning one jsonb of exact statistics';
