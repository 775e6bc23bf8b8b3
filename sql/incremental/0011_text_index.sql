-- 0011: a chunk's full-text vector (tsv) is written by pgrag, not computed by the server on
-- every write of the text. A render at the commit of a writer whose session asks for it
-- (pgrag.tsvector = worker), of at most 100 documents, while a worker runs, leaves it NULL, as
-- it leaves the embedding, and the worker fills it (pgrag.index_text), ahead of the
-- embeddings; every other render fills it as it writes. Computing it is a good part of the
-- cost of writing a chunk (a 900-character document: 0.39 ms an UPDATE with the generated
-- column, 0.08 ms without it, docs/benchmarks.md). Searches stay exact meanwhile:
-- the full-text match and rank of a chunk whose tsv is NULL are computed from its text
-- (pgrag._search_statement), found through the index below, which holds only those chunks.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.

-- No rewrite (the values stay), but an ACCESS EXCLUSIVE lock on the store, which every search
-- and every write's render takes too: the migration waits at most 5 s for it rather than queue
-- them behind a long transaction, and fails (changing nothing) if it cannot have it. The index
-- starts empty (every tsv is set), but building it reads the table: writes to the store wait
-- for that (seconds at 1,000,000 chunks), searches do not.
do $$
declare
    waited text := current_setting('lock_timeout');
begin
    perform pg_catalog.set_config('lock_timeout', '5s', true);
    alter table pgrag.chunks alter column tsv drop expression;
    perform pg_catalog.set_config('lock_timeout', waited, true);
exception when lock_not_available then
    raise exception using errcode = 'lock_not_available',
        message = 'pgrag.chunks is held by a transaction open for more than 5 s (a search, a '
                  'write, the worker)',
        hint = 'let it end (pg_stat_activity shows it), then run the upgrade again';
end
$$;

create index chunks_tsv_pending on pgrag.chunks (id) where tsv is null;

-- When a worker last filled tsvectors in (pgrag.index_text): a commit defers them (when its
-- session asks) only while one does, so that a store without a running worker never piles them
-- up.
alter table pgrag.settings add column text_indexed_at timestamptz;

comment on column pgrag.settings.text_indexed_at is
    'When pgrag.index_text last ran (at most every 10 s): a render at the commit of a session '
    'with pgrag.tsvector = worker leaves tsvectors NULL only while this is under a minute old';

comment on column pgrag.chunks.tsv is
    'to_tsvector(''english'', text) (pgrag.text_tsvector), written by pgrag; NULL: not yet '
    'computed (a commit-time render asked to leave it to the worker did; searches compute it '
    'from the text)';
