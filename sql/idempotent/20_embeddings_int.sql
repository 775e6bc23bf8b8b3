-- Embeddings, internals. How workers share the queue (docs/embeddings.md): a worker claims a
-- chunk by taking a session-level advisory lock on its id, then embeds with no transaction open,
-- then writes the vector in one short transaction, then releases the lock. Row locks are never
-- held while the model runs, so the sync triggers that rewrite chunks never wait for an
-- embedder. A killed worker's locks vanish with its connection; its batch was never written, so
-- the next worker takes it.

create or replace function pgrag._chunk_lock_keys(chunk bigint, out key1 integer, out key2 integer)
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
    -- (class, object) of the chunk's advisory lock: a fixed class 'pgrg' mixed with the high
    -- 32 bits, the low 32 bits as the object. One-to-one for every bigint id.
    select 1885827687 # (chunk >> 32)::integer,
           ((chunk & 4294967295) - 2147483648)::integer
$$;

comment on function pgrag._chunk_lock_keys(bigint) is
    'The two-integer advisory lock key an embedding worker holds on a chunk it claimed';



create or replace function pgrag._vectors()
returns bigint
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The chunks that have a vector (the worker's tuning, `pgrag reindex`): every chunk (an
-- index-only count) less those waiting for one (a partial index), a few ms at 1,000,000 chunks,
-- where counting the vectors themselves reads the heap. Under the caller's row-level security.
as $$
    select (select count(*) from pgrag.chunks)
           - (select count(*) from pgrag.chunks where embedding is null)
$$;

comment on function pgrag._vectors() is
    'How many chunks have a vector (every chunk less those waiting for one)';
