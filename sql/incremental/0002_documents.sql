-- 0002: document types and their sync triggers' registry.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.

-- The parent's source key of a child chunk, so children find (and re-find) their parent chunk.
alter table pgrag.chunks add column parent_key text;

create index chunks_parent_key on pgrag.chunks (doc_type, parent_key) where parent_key is not null;

create table pgrag.doc_types (
    name text primary key check (name ~ '^[a-z][a-z0-9_]{0,39}$'),
    -- the relation (view) that renders one row per document:
    -- source_key, [parent_key], text, [metadata]
    source regclass not null,
    -- pgrag made the view from a query given at declaration (dropped with the type)
    owns_source boolean not null,
    key_type text not null,
    parent_type text references pgrag.doc_types (name),
    metadata_schema jsonb not null default '{}'::jsonb check (jsonb_typeof(metadata_schema) = 'object'),
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);

comment on table pgrag.doc_types is 'Declared document types: where they render from, and their parent type';

create table pgrag.doc_watches (
    doc_type text not null references pgrag.doc_types (name) on delete cascade,
    source_table regclass not null,
    -- a SELECT over `changed` (the statement's old and new rows of source_table) yielding the
    -- keys of the documents to rebuild
    key_query text not null,
    primary key (doc_type, source_table)
);

comment on table pgrag.doc_watches is 'For each table feeding a document type: changed rows → document keys';
