-- 0009: the shape of a search hit, written once.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.

-- One row of a search: the chunk, its scores, its parent, and how the vectors were searched
-- ('index', 'exact', or 'text' without a vector search). Every search function returns it.
create type pgrag.search_hit as (
    id bigint,
    doc_type text,
    source_key text,
    text text,
    metadata jsonb,
    score double precision,         -- hybrid: reciprocal rank fusion; vector: 1 - cosine
                                    -- distance; text: ts_rank
    distance double precision,      -- cosine distance (NULL when only full text found it)
    vector_rank integer,
    text_rank integer,
    text_score real,
    parent_id bigint,
    parent_source_key text,
    parent_text text,
    scan text
);

comment on type pgrag.search_hit is
    'One search result: the chunk, its scores and ranks, its parent, and the vector scan used';
