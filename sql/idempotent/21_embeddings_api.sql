-- Embeddings: the worker's claim and store, per-chunk failures, the content and query caches,
-- re-embedding with another model (docs/embeddings.md). pgrag's worker and client call these;
-- so may any other embedder that follows the same protocol.

create or replace function pgrag.claim_chunks(model_name text, batch_size integer, max_attempts integer)
returns table (claimed_id bigint, claimed_text text, claimed_hash bytea, cached_embedding vector)
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    candidate bigint;
    k record;
    taken integer := 0;
begin
    if batch_size is null or batch_size < 1 then
        raise exception using
            errcode = 'PR006',
            message = format('batch size %s is not a positive number', batch_size),
            hint = 'pass a batch size of 1 or more';
    end if;
    for candidate in
        select c.id
        from pgrag.chunks c
        where c.embedding is null
          and not exists (
              select 1
              from pgrag.embed_errors e
              where e.chunk_id = c.id
                and e.model = model_name
                and e.content_hash = c.content_hash
                and (e.attempts >= max_attempts or e.retry_at > now()))
        order by c.id
    loop
        select * into k from pgrag._chunk_lock_keys(candidate);
        continue when not pg_try_advisory_lock(k.key1, k.key2);
        -- A new statement, a new snapshot: the worker that held this lock until a moment ago
        -- may have written the vector since our scan began.
        return query
            select c.id, c.text, c.content_hash, ec.embedding
            from pgrag.chunks c
            left join pgrag.embedding_cache ec
                   on ec.model = model_name and ec.content_hash = c.content_hash
            where c.id = candidate and c.embedding is null;
        if found then
            taken := taken + 1;
            exit when taken >= batch_size;
        else
            perform pg_advisory_unlock(k.key1, k.key2);
        end if;
    end loop;
end
$$;

comment on function pgrag.claim_chunks(text, integer, integer) is
    'Claim up to batch_size chunks waiting for a vector (session advisory locks), with their '
    'cached vector under model_name if any; release them with pgrag.release_chunks';


create or replace function pgrag.release_chunks(ids bigint[])
returns integer
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    select count(*)::integer
    from unnest(ids) as t(id)
    cross join lateral pgrag._chunk_lock_keys(t.id) as k
    where pg_advisory_unlock(k.key1, k.key2)
$$;

comment on function pgrag.release_chunks(bigint[]) is
    'Release chunks claimed by pgrag.claim_chunks (call after the vectors are committed)';


select pgrag._drop_if_changed(to_regprocedure('pgrag.index_text(integer)'), 'integer',
                              'max_rows integer DEFAULT 500');

create or replace function pgrag.index_text(max_rows integer default 500)
returns integer
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- Fill in the full-text vector (pgrag.chunks.tsv: pgrag.text_tsvector of the text) of up to
-- max_rows chunks that have none, oldest first: those a render at a writer's commit left for
-- the worker (revision 0011; a session with pgrag.tsvector = worker), and any chunk written
-- other than by pgrag's renders. The worker calls it ahead of the embeddings (it costs a few
-- ms per 100 chunks, an embedding a second or more); so may a cron job or a session. Each call
-- records when it ran (pgrag.settings.text_indexed_at, at most every 10 s): a writer's commit
-- leaves the tsvectors NULL (when its session asks) only while something fills them in. A
-- chunk another transaction is writing is skipped (SKIP LOCKED), never waited for, and the
-- lock taken (FOR NO KEY UPDATE, as pgrag.store_embeddings takes) lets a child chunk's or an
-- embedder error's foreign key check through. Returns how many it filled: 0 when none is
-- waiting. The default, 500, is the worker's batch: its row locks held 50-150 ms, which a
-- render of one of them waits for.
declare
    n integer;
begin
    perform pgrag._check_range('max_rows', max_rows, 1, 100000);
    -- A worker is filling them in: commits may leave them to it (pgrag.sync_now). First, and
    -- never waiting (a transaction may hold the settings row: pgrag.store_embeddings shares
    -- it): waiting there with the chunks below locked held writers' renders up (found by
    -- review). A stamp in the future (a clock stepped back, a hand-set value) is put right.
    update pgrag.settings s set text_indexed_at = clock_timestamp()
     where s.ctid = (select x.ctid from pgrag.settings x for no key update skip locked)
       and (s.text_indexed_at is null
            or s.text_indexed_at not between clock_timestamp() - interval '10 seconds'
                                         and clock_timestamp());
    -- (the ids as an array, taken once: joined to a subquery, a planner that expected one
    -- such chunk ran it again for each, 20 s for 4,000 chunks)
    update pgrag.chunks c
       set tsv = pgrag.text_tsvector(c.text)
     where c.id = any(array(select x.id from pgrag.chunks x
                             where x.tsv is null
                             order by x.id
                             limit max_rows
                               for no key update skip locked))
       and c.tsv is null;
    get diagnostics n = row_count;
    return n;
end
$$;

comment on function pgrag.index_text(integer) is
    'Fill in the full-text vector of up to max_rows chunks that have none (the worker calls it)';


create or replace function pgrag.clean_pending_lists()
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
-- Security definer (pgrag's owner: PostgreSQL lets an index's owner clean it). Move the entries
-- waiting in the pending lists of the chunk store's GIN indexes (its metadata and full text,
-- of every partition) into the indexes, as VACUUM would: the worker calls it after each batch
-- of full-text vectors, so that no writer's commit has to. An insert that finds a list past
-- gin_pending_list_limit (4 MB) moves the whole list itself: at 100,000 customers one writer's
-- single-row commit took up to 0.8 s so, once every few thousand writes (docs/benchmarks.md,
-- "Fewer statements in a commit"). While this runs, such inserts skip it. It takes no
-- argument. Returns the pending-list pages it emptied.
declare
    n bigint;
begin
    select coalesce(sum(gin_clean_pending_list(i.indexrelid::regclass)), 0) into n
      from pg_index i
      join pg_class c on c.oid = i.indexrelid
      join pg_am a on a.oid = c.relam
     where a.amname = 'gin' and c.relkind = 'i'
       and (i.indrelid = 'pgrag.chunks'::regclass  -- (a table not partitioned has no tree)
            or i.indrelid in (select t.relid from pg_partition_tree('pgrag.chunks') t));
    return n;
end
$$;

comment on function pgrag.clean_pending_lists() is
    'Move the chunk store''s GIN pending lists into their indexes (the worker calls it)';


create or replace function pgrag.check_embedder(model_name text, dim integer)
returns void
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    stored text;
begin
    select embedding_model into stored from pgrag.settings;
    if stored is not null and stored <> model_name then
        raise exception using
            errcode = 'PR007',
            message = format('this store''s vectors come from the model %s, not %s',
                             stored, model_name),
            hint = format('use %s (--model / PGRAG_EMBEDDER), or re-embed every chunk with '
                          '`pgrag reembed --model %s`', stored, model_name);
    end if;
    perform pgrag.check_dimension(dim);
end
$$;

comment on function pgrag.check_embedder(text, integer) is
    'Refuse (PR007, PR002) an embedder whose model or dimension differs from the store''s';


create or replace function pgrag.store_embeddings(
    model_name text, ids bigint[], hashes bytea[], vectors vector[])
returns setof bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s record;
    bad integer;
begin
    if cardinality(ids) is distinct from cardinality(hashes)
       or cardinality(ids) is distinct from cardinality(vectors) then
        raise exception using
            errcode = 'PR006',
            message = format('%s ids, %s hashes and %s vectors do not match',
                             cardinality(ids), cardinality(hashes), cardinality(vectors)),
            hint = 'pass one hash and one vector per chunk id';
    end if;
    -- The first vector binds the store to its model (settings.embedding_model is NULL until then).
    update pgrag.settings set embedding_model = model_name where embedding_model is null;
    -- FOR SHARE: a concurrent begin_reembed() waits for this batch, or this batch sees its model.
    select embedding_model, embedding_dim into strict s from pgrag.settings for share;
    if s.embedding_model is distinct from model_name then
        raise exception using
            errcode = 'PR007',
            message = format('this store''s vectors come from the model %s, not %s',
                             s.embedding_model, model_name),
            hint = format('use %s, or re-embed every chunk with `pgrag reembed --model %s`',
                          s.embedding_model, model_name);
    end if;
    -- (a cast, not vector_dims(): the search path holds no extension schema)
    select cardinality(v::real[]) into bad
    from unnest(vectors) as v
    where cardinality(v::real[]) <> s.embedding_dim
    limit 1;
    if found then
        raise exception using
            errcode = 'PR002',
            message = format('the model %s returned %s-dimensional vectors; this store holds %s',
                             model_name, bad, s.embedding_dim),
            hint = 'use a model with the stored dimension, or re-embed with `pgrag reembed --model ...`';
    end if;
    insert into pgrag.embedding_cache (model, content_hash, embedding)
    select distinct on (t.h) model_name, t.h, t.v
    from unnest(hashes, vectors) as t(h, v)
    order by t.h
    on conflict (model, content_hash) do nothing;
    -- Only where the text is still the text that was embedded: a chunk rewritten meanwhile has
    -- another content_hash and stays queued. Rows a user transaction holds (a sync trigger
    -- re-rendering them) are skipped, never waited for: the worker cannot deadlock with or
    -- hold up a writer, and a skipped chunk stays queued with its vector already cached.
    return query
        with free as (
            select c.id from pgrag.chunks c
            where c.id = any(ids)
            order by c.id
            for no key update skip locked
        ), written as (
            update pgrag.chunks c
            set embedding = t.v, embedding_model = model_name, embedded_at = now()
            from unnest(ids, hashes, vectors) as t(id, h, v), free f
            where c.id = t.id and f.id = c.id and c.content_hash = t.h and c.embedding is null
            returning c.id
        ), cleared as (
            delete from pgrag.embed_errors e using written w where e.chunk_id = w.id
        )
        select w.id from written w;
end
$$;

comment on function pgrag.store_embeddings(text, bigint[], bytea[], vector[]) is
    'Write vectors (and the content cache) for chunks whose text still has the embedded hash; '
    'returns the ids written';


create or replace function pgrag.record_embed_failures(
    model_name text, ids bigint[], hashes bytea[], error_text text, retry_after interval)
returns integer
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    with alive as (
        -- FOR KEY SHARE: a chunk deleted meanwhile is skipped, never a foreign key error.
        select c.id from pgrag.chunks c where c.id = any (ids) for key share
    ), recorded as (
        insert into pgrag.embed_errors as e
            (chunk_id, model, content_hash, attempts, error, failed_at, retry_at)
        select t.id, model_name, t.h, 1, error_text, now(), now() + retry_after
        from unnest(ids, hashes) as t(id, h)
        join alive a on a.id = t.id
        on conflict (chunk_id) do update
        set attempts = case when e.model = excluded.model and e.content_hash = excluded.content_hash
                            then e.attempts + 1 else 1 end,
            model = excluded.model,
            content_hash = excluded.content_hash,
            error = excluded.error,
            failed_at = excluded.failed_at,
            retry_at = now() + least(
                retry_after * power(2, least(
                    case when e.model = excluded.model and e.content_hash = excluded.content_hash
                         then e.attempts else 0 end, 16)),
                interval '1 day')
        returning 1
    )
    select count(*)::integer from recorded
$$;

comment on function pgrag.record_embed_failures(text, bigint[], bytea[], text, interval) is
    'Record that the embedder failed on these chunks; each is retried after an interval that '
    'doubles per attempt (at most a day)';


create or replace function pgrag.clear_embed_errors()
returns bigint
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    with gone as (delete from pgrag.embed_errors returning 1) select count(*) from gone
$$;

comment on function pgrag.clear_embed_errors() is
    'Forget every embedding failure, so the worker tries those chunks again';


create or replace function pgrag.embed_queue(model_name text, max_attempts integer)
returns table (waiting bigint, retrying bigint, given_up bigint)
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select count(*) filter (where e.chunk_id is null
                              or (e.attempts < max_attempts and e.retry_at <= now())),
           count(*) filter (where e.attempts < max_attempts and e.retry_at > now()),
           count(*) filter (where e.attempts >= max_attempts)
    from pgrag.chunks c
    left join pgrag.embed_errors e
           on e.chunk_id = c.id and e.model = model_name and e.content_hash = c.content_hash
    where c.embedding is null
$$;

comment on function pgrag.embed_queue(text, integer) is
    'Chunks waiting for a vector: ready now, failed and waiting to retry, given up on';


create or replace function pgrag.begin_reembed(model_name text, dim integer)
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgrag.settings;
    queued bigint;
    vector_schema name;
begin
    if model_name is null or model_name = '' then
        raise exception using errcode = 'PR006', message = 'no model name given',
            hint = 'pass the model to re-embed with, e.g. `pgrag reembed --model onnx`';
    end if;
    if dim is null or dim not between 1 and 2000 then
        raise exception using
            errcode = 'PR006',
            message = format('embedding dimension %s is out of range', dim),
            hint = 'pgvector''s HNSW index takes 1 to 2000 dimensions';
    end if;
    select * into strict s from pgrag.settings for update;
    if dim <> s.embedding_dim then
        -- A new vector type for the column: every vector is dropped anyway. The type and its
        -- operator class live in pgvector's schema, which the search path does not hold.
        vector_schema := pgrag._vector_schema();
        drop index if exists pgrag.chunks_embedding_hnsw;
        execute format(
            'alter table pgrag.chunks alter column embedding type %I.vector(%s) using null',
            vector_schema, dim);
        execute format(
            'create index chunks_embedding_hnsw on pgrag.chunks'
            ' using hnsw (embedding %I.vector_cosine_ops) with (m = %s, ef_construction = %s)',
            vector_schema, s.hnsw_m, s.hnsw_ef_construction);
        update pgrag.settings set embedding_dim = dim;
    end if;
    update pgrag.settings set embedding_model = model_name;
    update pgrag.chunks
    set embedding = null, embedding_model = null, embedded_at = null
    where embedding is not null or embedding_model is not null;
    delete from pgrag.embed_errors;
    select count(*) into queued from pgrag.chunks;
    perform pg_notify('pgrag_chunks', '');
    return queued;
end
$$;

comment on function pgrag.begin_reembed(text, integer) is
    'Switch the store to another model: drop every vector (changing the column''s dimension if '
    'needed) and queue every chunk; the content cache keeps the old model''s vectors';


create or replace function pgrag.query_cache_get(model_name text, hash bytea)
returns vector
language sql stable security definer
set search_path = pg_catalog, pg_temp
-- security definer: a reader may use the shared query cache without reading it (its question
-- texts are other tenants' questions). It returns one vector, for an exact hash, nothing else,
-- if younger than the server's TTL (pgrag.settings.query_cache_ttl: a caller cannot choose it).
-- Readers do not write it (pgrag.query_cache_put is invoker, and only the writer may).
as $$
    select q.embedding
    from pgrag.query_cache q, pgrag.settings s
    where q.model = model_name and q.query_hash = hash
      and q.created_at > now() - s.query_cache_ttl
$$;

comment on function pgrag.query_cache_get(text, bytea) is
    'The cached vector of a normalized question, if younger than the server''s TTL '
    '(pgrag.settings.query_cache_ttl; security definer)';


create or replace function pgrag.query_cache_put(
    model_name text, hash bytea, query_text text, vec vector)
returns void
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    delete from pgrag.query_cache
     where created_at <= now() - (select s.query_cache_ttl from pgrag.settings s);
    insert into pgrag.query_cache (model, query_hash, query, embedding)
    values (model_name, hash, query_text, vec)
    on conflict (model, query_hash) do update
    set query = excluded.query, embedding = excluded.embedding, created_at = now();
$$;

comment on function pgrag.query_cache_put(text, bytea, text, vector) is
    'Cache the vector of a normalized question; purges entries older than the server''s TTL';


create or replace function pgrag.prune_embedding_cache()
returns bigint
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    with gone as (
        delete from pgrag.embedding_cache ec
        where not exists (select 1 from pgrag.chunks c where c.content_hash = ec.content_hash)
        returning 1
    )
    select count(*) from gone
$$;

comment on function pgrag.prune_embedding_cache() is
    'Drop cached vectors of texts no chunk has any more (every model)';

