-- Undo 0011 (after idempotent.sql removed the functions): tsv computed by the server again. The
-- column is made anew (the table is rewritten, every tsvector computed), so it comes last in
-- the table where 0010 had it after content_hash: the same values, index and behaviour.
alter table pgrag.settings drop column text_indexed_at;
drop index pgrag.chunks_tsv_pending;
alter table pgrag.chunks drop column tsv;  -- (its GIN index with it)
alter table pgrag.chunks
    add column tsv tsvector generated always as (to_tsvector('english'::regconfig, text)) stored;
create index chunks_tsv_gin on pgrag.chunks using gin (tsv);
