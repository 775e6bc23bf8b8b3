-- Document types: declare, drop, refresh (render into pgrag.chunks), sync triggers, verify.
-- Introduced by revision 0002: applied by that revision and every later one.
-- Re-applied by every migration that reaches head.
--
-- A document type renders from a relation (a view, usually) with one row per document:
--   source_key (any type; stored as text), parent_key (only for child types), text, metadata jsonb
-- and watches the tables that feed it: for each, a key query over `changed` (the statement's
-- old and new rows of that table) yielding the keys of the documents to rebuild.
--
-- Key queries run with search_path = pg_catalog, pg_temp: schema-qualify every table in them.
--
-- For every declared type pgrag generates, as static SQL inside plpgsql with cached generic
-- plans (a document view can take ~8 ms to plan; a session now plans it once), and with fixed
-- DateStyle/IntervalStyle/TimeZone so a date in a key or a text renders the same in every
-- session (otherwise two sessions could write two versions of one document):
--   pgrag.render_<type>(keys)    the source view filtered by keys
--   pgrag.store_<type>(keys)     render + upsert + delete + re-link children + NOTIFY
--   pgrag.sync_<type>_<oid>()    the trigger function of one watched table (key query inlined)
-- They are regenerated whenever this file is applied, so a pgrag upgrade reaches old types.

create or replace function pgrag.refresh(doc_type text, keys text[] default null)
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render the documents of `doc_type` whose source_key is in `keys` (all of them when NULL)
-- into pgrag.chunks, set-based, in the caller's transaction:
--   new or changed text  → upserted with embedding NULL (the worker re-embeds it), NOTIFY sent
--   unchanged text       → keeps its vector (metadata and parent link still refreshed)
--   key no longer in the source → its chunk is deleted (and, through the FK, its children)
-- Returns the number of chunks inserted, changed, deleted or re-linked.
declare
    n bigint;
begin
    if not exists (select 1 from pgrag.doc_types d where d.name = doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', doc_type),
            hint = 'declare it with pgrag.declare_document(...); `pgrag documents list` shows the declared ones';
    end if;
    if keys is not null and cardinality(keys) = 0 then
        return 0;
    end if;
    execute format('select pgrag.%I($1)', 'store_' || doc_type) into n using keys;
    return n;
end
$fn$;

comment on function pgrag.refresh(text, text[]) is
    'Render documents of a type (all, or those with the given source keys) into pgrag.chunks';


create or replace function pgrag.pin_output_settings(ddl text)
returns text
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- A function that prints or parses document keys (or renders text) replaces the line
-- `@pinned_settings@` of its definition with these, the one list of the settings a value's
-- text form depends on: a key must print the same in every session (DateStyle 'SQL, DMY' would
-- print a date key 04/03/1990; extra_float_digits = 0 a float8 key 0.30000000000000004 as 0.3,
-- which no longer finds its row), or a keyed render misses its document and deletes its chunk.
return replace(ddl, '@pinned_settings@', $s$set datestyle = 'ISO, YMD'
        set intervalstyle = 'postgres'
        set timezone = 'UTC'
        set extra_float_digits = 1
        set bytea_output = 'hex'
        set lc_monetary = 'C'$s$);

comment on function pgrag.pin_output_settings(text) is
    'The settings every key-printing function pins, spliced into its definition';


create or replace function pgrag.create_render_function(doc_type text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create pgrag.render_<type>(keys) and pgrag.store_<type>(keys) for a declared type.
declare
    t pgrag.doc_types;
    cols jsonb;
    pk_expr text;
    md_expr text;
    body_expr text := 'd.text::text';
    tenant_expr text := 'null::text';
    render_fn text;
    -- The key's exact type, modifiers included, from the catalog (never from doc_types text):
    -- `character(3)` as regtype would be `character`, i.e. char(1), and cut 'ABW' to 'A'.
    key_type text;
    old_owner regrole;
    upsert text;
    -- From revision 0006 (sql/idempotent/40_security.sql, docs/security.md) a type may name a
    -- tenant column and sensitive columns, and chunks have a tenant column. Read through
    -- to_jsonb() and the catalog, so this file still works at the revisions before it.
    sec jsonb;
    secrets text;
    tenants boolean := exists (select 1 from pg_attribute
                                where attrelid = 'pgrag.chunks'::regclass
                                  and attname = 'tenant' and not attisdropped);
begin
    select * into strict t from pgrag.doc_types d where d.name = doc_type;
    sec := to_jsonb(t);
    select jsonb_object_agg(attname, format_type(atttypid, atttypmod)) into cols
      from pg_attribute where attrelid = t.source and attnum > 0 and not attisdropped;
    key_type := cols->>'source_key';
    pk_expr := case when cols ? 'parent_key' then 'd.parent_key::text' else 'null::text' end;
    md_expr := case when cols ? 'metadata' then 'coalesce(d.metadata, ''{}''::jsonb)'
                    else '''{}''::jsonb' end;
    if sec->>'tenant_column' is not null then
        -- '' for a missing tenant: a tenant-scoped document no reader's tenant matches
        tenant_expr := format('coalesce(d.%I::text, '''')', sec->>'tenant_column');
    end if;
    if coalesce(sec->'sensitive', '{}') <> '{}' then
        -- Sensitive values are cut out of the text and metadata here, before anything stores them.
        select format('jsonb_build_object(%s)', string_agg(format('%L, d.%I', k, k), ', ' order by k))
          into secrets from jsonb_object_keys(sec->'sensitive') k;
        body_expr := format('pgrag.redact_text(%s, %s, %L::jsonb)', body_expr, secrets, sec->'sensitive');
        md_expr := format('pgrag.redact_jsonb(%s, %s, %L::jsonb)', md_expr, secrets, sec->'sensitive');
    end if;
    render_fn := format('pgrag.%I', 'render_' || t.name);

    -- Replaced in place, which keeps its owner (the role that declared the type: a migration
    -- regenerating it must not take it over, or that role could no longer re-declare or drop
    -- the type). Dropped first only when its result differs (revision 0006 added the tenant
    -- column), then given back to its owner.
    old_owner := (select p.proowner::regrole from pg_proc p
                   where p.oid = to_regprocedure(render_fn || '(text[])'));
    if old_owner is not null
       and pg_get_function_result(to_regprocedure(render_fn || '(text[])'))
           is distinct from 'TABLE(key text, parent text, body text, meta jsonb, tenant text)' then
        execute format('drop function %s(text[])', render_fn);
    end if;
    execute pgrag.pin_output_settings(format($f$
        create or replace function %s(keys text[])
        returns table (key text, parent text, body text, meta jsonb, tenant text)
        language plpgsql stable security invoker rows 10
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        declare
            changed_keys text[];
            bad_key text;
            read_back text;
        begin
            if keys is null then
                return query select d.source_key::text, %2$s, %3$s, %4$s, %5$s from %6$s d;
            else
                -- Keys are source_key::text. One the cast to the key type changes names no
                -- document, unless the cast is wrong (as `character` for character(3) was):
                -- then its document exists, the render would miss it and the store delete it.
                -- Refuse that; the scan by text runs only for such keys.
                select array_agg(u.k) into changed_keys
                  from unnest(keys) as u(k) where u.k::%7$s::text is distinct from u.k;
                if changed_keys is not null then
                    select d.source_key::text, d.source_key::text::%7$s::text
                      into bad_key, read_back
                      from %6$s d where d.source_key::text = any(changed_keys) limit 1;
                end if;
                if bad_key is not null then
                    raise exception using
                        errcode = 'PR004',
                        message = format('key %%L of %%s reads back as %%L after the cast to its '
                                         'key type %%s: its document would be lost',
                                         bad_key, %8$L, read_back, %9$L),
                        hint = 'did the key column''s type change since the declaration? declare the type again to regenerate its functions';
                end if;
                return query select d.source_key::text, %2$s, %3$s, %4$s, %5$s from %6$s d
                             where d.source_key = any(keys::%7$s[]);
            end if;
        end
        $body$
        $f$,
        render_fn, pk_expr, body_expr, md_expr, tenant_expr, t.source,
        key_type,  -- format_type() of the catalog: a type name, never SQL of doc_types'
        t.name, key_type));
    if old_owner is not null and old_owner <> current_user::regrole then
        execute format('alter function %s(text[]) owner to %s', render_fn, old_owner);
    end if;

    -- The upsert, with separate statements for "these keys" and "all" so each has a good
    -- cached plan (an `or keys is null` would make the keyed one scan the whole type).
    upsert := format($u$
            with src as materialized (
                select r.key, r.parent, r.body, r.meta, r.tenant from %1$s(keys) r
            ),
            up as (
                insert into pgrag.chunks as c
                       (doc_type, source_key, parent_key, parent_id, text, metadata%4$s)
                select %2$L, s.key, s.parent,
                       (select p.id from pgrag.chunks p
                         where p.doc_type = %3$L and p.source_key = s.parent),
                       s.body, s.meta%5$s
                from src s
                on conflict (doc_type, source_key) do update
                set text = excluded.text,
                    metadata = excluded.metadata,
                    parent_key = excluded.parent_key,
                    parent_id = excluded.parent_id,%6$s
                    embedding = case when c.text = excluded.text then c.embedding end,
                    embedding_model = case when c.text = excluded.text then c.embedding_model end,
                    embedded_at = case when c.text = excluded.text then c.embedded_at end,
                    updated_at = now()
                where (c.text, c.metadata, c.parent_key, c.parent_id%7$s)
                      is distinct from (excluded.text, excluded.metadata, excluded.parent_key,
                                        excluded.parent_id%8$s)
                returning c.embedding is null as pending
            ),
            gone as (
                delete from pgrag.chunks c
                where c.doc_type = %2$L
                  and %%s
                  and not exists (select 1 from src s where s.key = c.source_key)
                returning 1
            )
            select (select count(*) from up), (select count(*) from up where pending),
                   (select count(*) from gone)
            into n_up, n_pending, n_gone
            $u$, render_fn, t.name, t.parent_type,
            case when tenants then ', tenant' else '' end,
            case when tenants then ', s.tenant' else '' end,
            case when tenants then E'\n                    tenant = excluded.tenant,' else '' end,
            case when tenants then ', c.tenant' else '' end,
            case when tenants then ', excluded.tenant' else '' end);

    execute pgrag.pin_output_settings(format($f$
        create or replace function pgrag.%1$I(keys text[])
        returns bigint
        language plpgsql volatile security invoker
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        declare
            n_up bigint;
            n_pending bigint;
            n_gone bigint;
            n_linked bigint := 0;
        begin
            -- Writers of one document take turns: a concurrent transaction re-rendering the
            -- same key waits here for the first to commit, then renders from a new snapshot
            -- (READ COMMITTED takes one per statement), so the last commit's text wins. Keys
            -- lock by one of 256 buckets, in bucket order (no deadlock between two of these;
            -- at most 256 lock-table entries per type per transaction); a full refresh locks
            -- the whole type.
            if keys is null then
                perform pg_advisory_xact_lock(%6$s::bigint);
            else
                perform pg_advisory_xact_lock_shared(%6$s::bigint);
                perform pg_advisory_xact_lock(%6$s, b)
                   from (select distinct hashtext(k) & 255 as b from unnest(keys) as u(k)) d
                  order by b;
            end if;

            if keys is null then
                %2$s;
            else
                %3$s;
            end if;

            -- Children rendered before their parent existed find it now.
            if %4$L::text[] is not null and keys is null then
                update pgrag.chunks ch
                   set parent_id = p.id
                  from pgrag.chunks p
                 where p.doc_type = %5$L
                   and ch.doc_type = any(%4$L::text[])
                   and ch.parent_key = p.source_key
                   and ch.parent_id is distinct from p.id;
                get diagnostics n_linked = row_count;
            elsif %4$L::text[] is not null then
                update pgrag.chunks ch
                   set parent_id = p.id
                  from pgrag.chunks p
                 where p.doc_type = %5$L
                   and p.source_key = any(keys)
                   and ch.doc_type = any(%4$L::text[])
                   and ch.parent_key = p.source_key
                   and ch.parent_id is distinct from p.id;
                get diagnostics n_linked = row_count;
            end if;

            if n_pending > 0 then
                perform pg_notify('pgrag_chunks', %5$L);
            end if;
            return n_up + n_gone + n_linked;
        end
        $body$
        $f$,
        'store_' || t.name,
        format(upsert, 'true'),
        format(upsert, 'c.source_key = any(keys)'),
        (select array_agg(c.name order by c.name) from pgrag.doc_types c where c.parent_type = t.name),
        t.name,
        hashtext('pgrag document ' || t.name)));
end
$fn$;


create or replace function pgrag.run_sync(doc_type text, keys text[], op text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- What every generated trigger function does once it has the keys: refresh them, and turn a
-- failure into an error that names the document type and keys (the statement is aborted).
-- A type with sensitive columns (revision 0006) gets the SQLSTATE only: the message of an
-- error in its view may quote a row's value, and errors end up in logs.
begin
    perform pgrag.refresh(doc_type, keys);
exception
    when deadlock_detected or serialization_failure or lock_not_available or query_canceled then
        raise;  -- contention or a timeout, not the document: keep the SQLSTATE a caller retries on
    when others then
        raise exception using
            errcode = 'PR004',
            message = format('pgrag could not rebuild %s document(s) %s after %s on %s: %s',
                             doc_type,
                             coalesce(array_to_string(keys[1:5], ', ')
                                      || case when cardinality(keys) > 5
                                              then format(' (and %s more)', cardinality(keys) - 5)
                                              else '' end,
                                      '(all)'),
                             op, source_table,
                             case when coalesce((select to_jsonb(d)->'sensitive'
                                                 from pgrag.doc_types d
                                                 where d.name = doc_type), '{}') <> '{}'
                                  then format('error %s (message withheld: %s has sensitive'
                                              ' columns; run pgrag.refresh(%L) to see it)',
                                              sqlstate, doc_type, doc_type)
                                  else sqlerrm end),
            hint = format('fix the document view %s or the data; the statement was rolled back',
                          (select d.source::text from pgrag.doc_types d where d.name = doc_type));
end
$fn$;


create or replace function pgrag.sync_function_name(doc_type text, source_table regclass)
returns text
language sql stable strict security invoker
set search_path = pg_catalog, pg_temp
-- by the table's qualified name, not its OID, so the name survives a dump and restore
return (select format('sync_%s_%s', doc_type, left(md5(n.nspname || '.' || c.relname), 10))
          from pg_class c join pg_namespace n on n.oid = c.relnamespace
         where c.oid = source_table);


create or replace function pgrag.check_one_statement(query text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Parse and plan `query` as exactly one statement without executing it: a cursor refuses a
-- string of several statements ("cannot open multi-query plan as cursor"), where EXECUTE would
-- run them all. Planning is not nothing: it may evaluate immutable functions with constant
-- arguments (constant folding), as the calling role. Declarations pass their SQL through here first, so a source or key query cannot
-- close its parenthesis and append statements of its own (`select 1) as q(k); drop ...`).
declare
    c refcursor;
begin
    open c no scroll for execute query;
    close c;
end
$fn$;

comment on function pgrag.check_one_statement(text) is
    'Parse and plan a query as exactly one statement without executing it (planning may still '
    'evaluate immutable functions)';


create or replace function pgrag.create_sync_function(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create the trigger function of one watched table: the key query inlined as static SQL
-- over the statement's transition rows (`changed`), then, from revision 0007, the keys and the
-- changed rows are queued for the commit-time render (sql/idempotent/50_sync_at_commit.sql);
-- with `set pgrag.sync = immediate` (and before 0007) pgrag.run_sync renders them at once.
-- `set pgrag.sync = off` in a session skips it (bulk loads); run pgrag.refresh(type) after.
-- From 0007 also pgrag.keys_<type>_<hash>(changed rows): the key query over queued rows, which
-- the commit-time render asks again on a fresh snapshot.
declare
    kq text;
    keys_sql text := E'select array_agg(distinct q.k::text) into keys from (%s\n) as q(k) where q.k is not null';
    at_commit boolean := to_regclass('pgrag.sync_queue') is not null;
    queue_block text := '';
begin
    select w.key_query into strict kq
      from pgrag.doc_watches w
     where w.doc_type = create_sync_function.doc_type
       and w.source_table = create_sync_function.source_table;
    -- One SELECT, also for key queries stored before declarations checked this. Checking
    -- plans the query, and planning may run immutable functions it calls: so only as the role
    -- that owns the trigger function already (or when there is none yet, at declaration), never
    -- as a migrating role regenerating a function another role declared.
    begin
        if coalesce((select p.proowner = (select oid from pg_roles where rolname = current_user)
                       from pg_proc p
                      where p.oid = to_regprocedure(format('pgrag.%I()',
                                        pgrag.sync_function_name(doc_type, source_table)))),
                    true) then
            perform pgrag.check_one_statement(format(
                E'with changed as (select * from %s limit 0) select q.k from (%s\n) as q(k)',
                source_table, kq));
        end if;
    exception when others then
        raise exception using errcode = 'PR003',
            message = format('the key query of %s for %s is not one SELECT: %s',
                             doc_type, source_table, sqlerrm),
            hint = 'declare the type again with a key query that is one SELECT, or drop it';
    end;
    if at_commit then
        -- Queue the keys with the statement's rows (as the table's row type, in text), and
        -- this transaction's marker, whose deferred trigger renders the queue at commit.
        queue_block := format($q$
            if coalesce(current_setting('pgrag.sync', true), '') <> 'immediate' then
                if tg_op = 'TRUNCATE' then
                    insert into pgrag.sync_queue (doc_type, source_table, op)
                    values (%1$L, tg_relid, tg_op);
                    insert into pgrag.sync_pending default values on conflict do nothing;
                    return null;
                end if;
                if tg_op = 'INSERT' then
                    with changed as (select * from pgrag_new) %2$s;
                    if cardinality(keys) > 0 then
                        changed_rows := (select array_agg(r)::text from pgrag_new r);
                    end if;
                elsif tg_op = 'UPDATE' then
                    with changed as (select * from pgrag_new union all select * from pgrag_old) %2$s;
                    if cardinality(keys) > 0 then
                        changed_rows := (select array_agg(r)::text
                                   from (select * from pgrag_new union all select * from pgrag_old) r);
                    end if;
                else
                    with changed as (select * from pgrag_old) %2$s;
                    if cardinality(keys) > 0 then
                        changed_rows := (select array_agg(r)::text from pgrag_old r);
                    end if;
                end if;
                if cardinality(keys) > 0 then
                    insert into pgrag.sync_queue (doc_type, source_table, op, keys, changed)
                    values (%1$L, tg_relid, tg_op, keys, changed_rows);
                    insert into pgrag.sync_pending default values on conflict do nothing;
                end if;
                return null;
            end if;$q$, doc_type, format(keys_sql, kq));
        execute pgrag.pin_output_settings(format($f$
            create or replace function pgrag.%1$I(changed_rows text)
            returns text[]
            language plpgsql volatile security invoker
            set search_path = pg_catalog, pg_temp
            @pinned_settings@
            as %2$L
            $f$,
            regexp_replace(pgrag.sync_function_name(doc_type, source_table), '^sync_', 'keys_'),
            format($body$
            declare
                keys text[];
            begin
                with changed as (select * from unnest(changed_rows::%1$s[])) %2$s;
                return keys;
            end
            $body$, source_table, format(keys_sql, kq))));
    end if;
    -- The body goes in as a quoted literal (%L), never between dollar quotes: a key query that
    -- contains `$body$` cannot end the body early and add code of its own.
    execute pgrag.pin_output_settings(format($f$
        create or replace function pgrag.%1$I()
        returns trigger
        language plpgsql volatile security invoker
        set search_path = pg_catalog, pg_temp
        @pinned_settings@
        as %2$L
        $f$,
        pgrag.sync_function_name(doc_type, source_table),
        format($body$
        declare
            keys text[];
            done text[] := '{}';
            changed_rows text;
        begin
            if current_setting('pgrag.sync', true) = 'off' then
                return null;
            end if;%3$s
            if tg_op = 'TRUNCATE' then
                perform pgrag.run_sync(%2$L, null, tg_op, tg_relid::regclass);
                return null;
            end if;
            -- The key query reads other tables (an item's order's customer...) as of this
            -- statement's start. Once our documents are re-rendered (after waiting for any
            -- concurrent writer of them), ask again on a fresh snapshot: a concurrent commit
            -- may have moved rows to documents we did not know of. Repeat until none is new.
            loop
                if tg_op = 'INSERT' then
                    with changed as (select * from pgrag_new) %1$s;
                elsif tg_op = 'UPDATE' then
                    with changed as (select * from pgrag_new union all select * from pgrag_old) %1$s;
                else
                    with changed as (select * from pgrag_old) %1$s;
                end if;
                keys := array(select k from unnest(keys) as u(k) except select unnest(done));
                exit when cardinality(keys) = 0;
                perform pgrag.run_sync(%2$L, keys, tg_op, tg_relid::regclass);
                done := done || keys;
            end loop;
            return null;
        end
        $body$,
        format(keys_sql, kq),
        doc_type,
        queue_block)));
end
$fn$;


create or replace function pgrag.drop_sync_triggers(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
declare
    suffix text;
begin
    if exists (select 1 from pg_class where oid = source_table) then
        foreach suffix in array array['ins', 'upd', 'del', 'trn'] loop
            execute format('drop trigger if exists %I on %s',
                           format('pgrag_%s_%s', doc_type, suffix), source_table);
        end loop;
    end if;  -- else the table is gone, and its triggers with it (drop_document sweeps the rest)
    if pgrag.sync_function_name(doc_type, source_table) is not null then
        execute format('drop function if exists pgrag.%I()',
                       pgrag.sync_function_name(doc_type, source_table));
        execute format('drop function if exists pgrag.%I(text)',  -- revision 0007's
                       regexp_replace(pgrag.sync_function_name(doc_type, source_table),
                                      '^sync_', 'keys_'));
    end if;
end
$fn$;


create or replace function pgrag.create_sync_triggers(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
declare
    prefix text := format('pgrag_%s_', doc_type);
    fn text := format('pgrag.%I', pgrag.sync_function_name(doc_type, source_table));
begin
    perform pgrag.create_sync_function(doc_type, source_table);
    execute format(
        'create trigger %I after insert on %s referencing new table as pgrag_new'
        ' for each statement execute function %s()',
        prefix || 'ins', source_table, fn);
    execute format(
        'create trigger %I after update on %s referencing old table as pgrag_old new table as pgrag_new'
        ' for each statement execute function %s()',
        prefix || 'upd', source_table, fn);
    execute format(
        'create trigger %I after delete on %s referencing old table as pgrag_old'
        ' for each statement execute function %s()',
        prefix || 'del', source_table, fn);
    execute format(
        'create trigger %I after truncate on %s for each statement execute function %s()',
        prefix || 'trn', source_table, fn);
end
$fn$;


create or replace function pgrag.drop_document(name text, keep_chunks boolean default false)
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Remove a document type: its triggers, the view pgrag made for it, its chunks (unless
-- keep_chunks) and its registration. Nothing else. Returns the number of chunks removed.
declare
    t pgrag.doc_types;
    w record;
    children text;
    n bigint := 0;
begin
    select * into t from pgrag.doc_types d where d.name = drop_document.name;
    if not found then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', drop_document.name),
            hint = '`pgrag documents list` shows the declared types';
    end if;
    select string_agg(d.name, ', ') into children from pgrag.doc_types d where d.parent_type = t.name;
    if children is not null then
        raise exception using errcode = 'PR003',
            message = format('document type %s is the parent of %s', t.name, children),
            hint = 'drop the child types first';
    end if;
    for w in select * from pgrag.doc_watches dw where dw.doc_type = t.name loop
        perform pgrag.drop_sync_triggers(t.name, w.source_table);
    end loop;
    if not keep_chunks then
        delete from pgrag.chunks c where c.doc_type = t.name;
        get diagnostics n = row_count;
    end if;
    delete from pgrag.doc_types d where d.name = t.name;
    execute format('drop function if exists pgrag.%I(text[])', 'store_' || t.name);
    execute format('drop function if exists pgrag.%I(text[])', 'render_' || t.name);
    -- trigger functions of tables dropped meanwhile
    for w in select p.oid::regprocedure as fn from pg_proc p
              where p.pronamespace = 'pgrag'::regnamespace
                and p.proname ~ ('^(sync|keys)_' || t.name || '_[0-9a-f]{10}$') loop
        execute format('drop function if exists %s', w.fn);
    end loop;
    -- the parent's store function stops re-linking this type's chunks
    if t.parent_type is not null then
        perform pgrag.create_render_function(t.parent_type);
    end if;
    if t.owns_source and exists (select 1 from pg_class where oid = t.source) then
        execute format('drop view %s', t.source);
    end if;
    return n;
end
$fn$;

comment on function pgrag.drop_document(text, boolean) is
    'Remove a document type: its triggers, its generated view, its chunks; nothing else';


-- Revision 0006 added tenant_column and sensitive: drop the five-argument version, so that a
-- call with five arguments or fewer is not ambiguous between the two.
drop function if exists pgrag.declare_document(text, text, jsonb, text, jsonb);

create or replace function pgrag.declare_document(
    name text,
    source text,
    watches jsonb default '{}'::jsonb,
    parent_type text default null,
    metadata_schema jsonb default '{}'::jsonb,
    tenant_column text default null,
    sensitive jsonb default '{}'::jsonb
)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Declare (or re-declare, replacing) a document type.
--   name             lower-case identifier, e.g. customer_profile
--   source           a view/table name, or a SELECT (pgrag then creates view pgrag.doc_<name>)
--                    yielding source_key, [parent_key], text, [metadata jsonb]
--   watches          {"schema.table": "select <key> from changed [join ...]", ...}
--   parent_type      the declared type whose chunks are these chunks' parents (by parent_key)
--   metadata_schema  {"key": "text|integer|numeric|boolean|date|text[]|integer[]", ...}
--   tenant_column    a source column: each chunk's tenant (revision 0006, docs/security.md)
--   sensitive        {"column": "omit" | "mask"}: source columns whose values are cut out of the
--                    text and metadata (revision 0006, docs/security.md)
-- Everything is checked before anything is created; the whole declaration is one transaction.
-- Chunks are not rendered here: call pgrag.refresh(name) (or `pgrag rebuild name`); except when
-- a re-declaration changes tenant_column or sensitive: its chunks are then re-rendered here.
declare
    src regclass;
    owns boolean := false;
    view_name text := format('doc_%s', declare_document.name);
    cols jsonb;
    ktype text;
    w record;
    tbl regclass;
    dup text;
    old pgrag.doc_types;
    bad text;
    secured boolean := exists (select 1 from pg_attribute
                                where attrelid = 'pgrag.doc_types'::regclass
                                  and attname = 'tenant_column' and not attisdropped);
begin
    -- the name and the parent
    if declare_document.name is null or declare_document.name !~ '^[a-z][a-z0-9_]{0,39}$' then
        raise exception using errcode = 'PR003',
            message = format('invalid document type name %L', declare_document.name),
            hint = 'use a lower-case identifier of at most 40 characters, e.g. customer_profile';
    end if;
    if parent_type is not null and not exists (
        select 1 from pgrag.doc_types d where d.name = parent_type and d.name <> declare_document.name
    ) then
        raise exception using errcode = 'PR003',
            message = format('parent type %s of %s does not exist', parent_type, declare_document.name),
            hint = 'declare the parent type first (`pgrag documents list` shows the declared ones)';
    end if;
    if jsonb_typeof(watches) is distinct from 'object' then
        raise exception using errcode = 'PR003',
            message = format('watches of %s must be a JSON object {"schema.table": "key query"}', declare_document.name),
            hint = 'e.g. {"shop.orders": "select customer_id from changed"}';
    end if;
    if jsonb_typeof(metadata_schema) is distinct from 'object' then
        raise exception using errcode = 'PR003',
            message = format('metadata_schema of %s must be a JSON object {"key": "type"}', declare_document.name),
            hint = 'types: text, integer, numeric, boolean, date, text[], integer[]';
    end if;
    select string_agg(format('%s: %s', key, value), ', ') into bad
      from jsonb_each(metadata_schema)
     where value not in ('"text"', '"integer"', '"numeric"', '"boolean"', '"date"', '"text[]"', '"integer[]"');
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('metadata_schema of %s has unknown types (%s)', declare_document.name, bad),
            hint = 'types: text, integer, numeric, boolean, date, text[], integer[]';
    end if;
    sensitive := coalesce(sensitive, '{}'::jsonb);
    if (tenant_column is not null or sensitive <> '{}') and not secured then
        raise exception using errcode = 'PR003',
            message = format('%s declares a tenant column or sensitive columns, which this database '
                             'cannot hold yet', declare_document.name),
            hint = 'migrate it to revision 0006 or later: `pgrag db upgrade`';
    end if;
    if jsonb_typeof(sensitive) is distinct from 'object' then
        raise exception using errcode = 'PR003',
            message = format('sensitive of %s must be a JSON object {"column": "omit" | "mask"}',
                             declare_document.name),
            hint = 'e.g. {"email": "mask"}';
    end if;
    select string_agg(format('%s: %s', key, value), ', ') into bad
      from jsonb_each(sensitive) where value not in ('"omit"', '"mask"');
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('sensitive of %s has unknown modes (%s)', declare_document.name, bad),
            hint = 'omit (cut the value out) or mask (replace it with [masked <column>])';
    end if;

    -- replacing: remove the old triggers and generated view first (same transaction)
    select * into old from pgrag.doc_types d where d.name = declare_document.name;
    if found then
        for w in select * from pgrag.doc_watches dw where dw.doc_type = old.name loop
            perform pgrag.drop_sync_triggers(old.name, w.source_table);
        end loop;
        delete from pgrag.doc_watches dw where dw.doc_type = old.name;
        if old.owns_source and exists (select 1 from pg_class where oid = old.source) then
            execute format('drop view %s', old.source);
        end if;
    end if;

    -- the source: a relation, or a query pgrag turns into a view
    if source ~* '^\s*(select|with|values|table)\s' then
        begin
            perform pgrag.check_one_statement(format(E'select * from (%s\n) as s', source));
            execute format('create view pgrag.%I as %s', view_name, source);
        exception when others then
            raise exception using errcode = 'PR003',
                message = format('the source query of %s does not compile: %s', declare_document.name, sqlerrm),
                hint = 'schema-qualify every table; the query must yield source_key, text[, parent_key][, metadata]';
        end;
        src := format('pgrag.%I', view_name)::regclass;
        owns := true;
    else
        src := to_regclass(source);
        if src is null then
            raise exception using errcode = 'PR003',
                message = format('the source %s of %s is neither an existing view or table nor a SELECT',
                                 source, declare_document.name),
                hint = 'create the view first, schema-qualify its name, or pass the SELECT itself';
        end if;
    end if;

    select jsonb_object_agg(attname, format_type(atttypid, atttypmod)) into cols
      from pg_attribute where attrelid = src and attnum > 0 and not attisdropped;
    if not (cols ? 'source_key' and cols ? 'text') then
        raise exception using errcode = 'PR003',
            message = format('the source of %s lacks required column(s) %s (it has %s)',
                             declare_document.name,
                             array_to_string(array_remove(array[
                                 case when not cols ? 'source_key' then 'source_key' end,
                                 case when not cols ? 'text' then 'text' end], null), ', '),
                             (select string_agg(k, ', ') from jsonb_object_keys(cols) k)),
            hint = 'alias the columns: ... as source_key, ... as text[, ... as parent_key][, ... as metadata]';
    end if;
    if parent_type is not null and not cols ? 'parent_key' then
        raise exception using errcode = 'PR003',
            message = format('%s names parent type %s but its source has no parent_key column',
                             declare_document.name, parent_type),
            hint = 'add the parent''s source key as parent_key';
    end if;
    select string_agg(k, ', ') into bad
      from (select jsonb_object_keys(sensitive) as k
            union all select tenant_column where tenant_column is not null) x
     where not cols ? k or k in ('source_key', 'parent_key', 'text', 'metadata');
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('the tenant or sensitive column(s) %s of %s are not extra columns of '
                             'its source (it has %s)', bad, declare_document.name,
                             (select string_agg(k, ', ') from jsonb_object_keys(cols) k)),
            hint = 'add them to the source next to source_key and text, e.g. c.email, a.tenant_id';
    end if;
    if tenant_column is null and secured and exists (
        select 1 from pgrag.doc_types d where d.name = parent_type and to_jsonb(d)->>'tenant_column' is not null
    ) then
        raise exception using errcode = 'PR003',
            message = format('%s is a child of %s, which has a tenant column, but has none itself',
                             declare_document.name, parent_type),
            hint = 'pass tenant_column => ... so its chunks are tenant-scoped like their parents';
    end if;
    select string_agg(d.name, ', ' order by d.name) into bad
      from pgrag.doc_types d
     where tenant_column is not null and secured and d.parent_type = declare_document.name
       and to_jsonb(d)->>'tenant_column' is null;
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('%s gets a tenant column, but its child type(s) %s have none',
                             declare_document.name, bad),
            hint = 're-declare the child types with tenant_column => ... first';
    end if;
    if cols ? 'metadata' and cols->>'metadata' <> 'jsonb' then
        raise exception using errcode = 'PR003',
            message = format('the metadata column of %s is %s, not jsonb', declare_document.name, cols->>'metadata'),
            hint = 'build it with jsonb_build_object(...)';
    end if;
    ktype := cols->>'source_key';

    -- duplicate keys would make two documents fight over one chunk
    execute format('select d.source_key::text from %s d group by 1 having count(*) > 1 limit 1', src)
       into dup;
    if dup is not null then
        raise exception using errcode = 'PR003',
            message = format('the source of %s yields source_key %s more than once', declare_document.name, dup),
            hint = 'one row per document: group by the key, or aggregate the rows of each key';
    end if;

    insert into pgrag.doc_types as d (name, source, owns_source, key_type, parent_type, metadata_schema)
    values (declare_document.name, src, owns, ktype, parent_type, metadata_schema)
    on conflict on constraint doc_types_pkey do update
    set source = excluded.source, owns_source = excluded.owns_source, key_type = excluded.key_type,
        parent_type = excluded.parent_type, metadata_schema = excluded.metadata_schema,
        updated_at = now();
    if secured then  -- (dynamic: the columns exist from revision 0006)
        execute 'update pgrag.doc_types d set tenant_column = $1, sensitive = $2 where d.name = $3'
          using tenant_column, sensitive, declare_document.name;
    end if;
    perform pgrag.create_render_function(declare_document.name);
    if parent_type is not null then
        perform pgrag.create_render_function(parent_type);  -- its store function re-links children
    end if;
    if old.parent_type is not null and old.parent_type is distinct from parent_type then
        perform pgrag.create_render_function(old.parent_type);  -- no longer its child
    end if;

    -- the watched tables: each must exist and its key query must compile against it
    for w in select key as tbl_name, value as kq from jsonb_each(watches) loop
        tbl := to_regclass(w.tbl_name);
        if tbl is null or not exists (
            select 1 from pg_class where oid = tbl and relkind in ('r', 'p')
        ) then
            raise exception using errcode = 'PR003',
                message = format('%s watches %s, which is not an existing table', declare_document.name, w.tbl_name),
                hint = 'schema-qualify the table name, e.g. shop.orders';
        end if;
        if jsonb_typeof(w.kq) <> 'string' then
            raise exception using errcode = 'PR003',
                message = format('the key query of %s for %s must be a string', declare_document.name, w.tbl_name),
                hint = 'e.g. "select customer_id from changed"';
        end if;
        begin
            perform pgrag.check_one_statement(format(
                E'with changed as (select * from %s limit 0) select array_agg(q.k::text) from (%s\n) as q(k)',
                tbl, w.kq #>> '{}'));
        exception when others then
            raise exception using errcode = 'PR003',
                message = format('the key query of %s for %s does not compile: %s',
                                 declare_document.name, w.tbl_name, sqlerrm),
                hint = 'select the document keys from `changed` (the changed rows); schema-qualify other tables';
        end;
        insert into pgrag.doc_watches (doc_type, source_table, key_query)
        values (declare_document.name, tbl, w.kq #>> '{}');
        perform pgrag.create_sync_triggers(declare_document.name, tbl);
    end loop;

    -- A re-declaration that changes the tenant column or the sensitive columns re-renders the
    -- type's chunks now, in this transaction: the stored ones carry the old tenant (NULL: every
    -- reader's) and the old masking, and must not outlive the declaration that replaced them.
    if secured and old.name is not null
       and (to_jsonb(old)->>'tenant_column', to_jsonb(old)->'sensitive')
           is distinct from (tenant_column, sensitive) then
        perform pgrag.refresh(declare_document.name);
    end if;
end
$fn$;

comment on function pgrag.declare_document(text, text, jsonb, text, jsonb, text, jsonb) is
    'Declare or replace a document type: its source view, watched tables and key queries, parent '
    'type, tenant column and sensitive columns';


do $do$
begin
    execute pgrag.pin_output_settings($def$
create or replace function pgrag.document_keys(doc_type text)
returns setof text
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
@pinned_settings@
as $fn$
#variable_conflict use_variable
-- Every source key a document type renders, in key order (for batched rebuilds), printed as the
-- generated functions print them (the settings pinned above).
declare
    src regclass;
begin
    select d.source into src from pgrag.doc_types d where d.name = document_keys.doc_type;
    if src is null then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', document_keys.doc_type),
            hint = '`pgrag documents list` shows the declared types';
    end if;
    return query execute format('select d.source_key::text from %s d order by d.source_key', src);
end
$fn$
$def$);
end
$do$;


create or replace function pgrag.verify(only_type text default null)
returns table (doc_type text, source_key text, problem text)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Compare every declared source view with the stored chunks. No rows means all is in sync.
-- problem: missing (in the view, no chunk), extra (a chunk the view no longer yields),
-- stale text, stale metadata, wrong parent.
declare
    t pgrag.doc_types;
begin
    if only_type is not null and not exists (select 1 from pgrag.doc_types d
                                              where d.name = only_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared (declared: %s)', only_type,
                             coalesce((select string_agg(d.name, ', ' order by d.name)
                                         from pgrag.doc_types d), 'none')),
            hint = '`pgrag documents list` shows the declared types';
    end if;
    for t in select * from pgrag.doc_types d
              where only_type is null or d.name = only_type
              order by d.parent_type nulls first, d.name loop
        if not exists (select 1 from pg_class where oid = t.source) then
            return query select t.name, null::text, 'source view is gone: re-declare the type';
            continue;
        end if;
        return query execute format($sql$
            with src as (
                select r.key as source_key, r.parent as parent_key, r.body as text,
                       r.meta as metadata
                from pgrag.%I(null) as r
            ),
            ch as (
                select c.source_key, c.parent_key, c.text, c.metadata, p.source_key as linked_key
                from pgrag.chunks c
                left join pgrag.chunks p on p.id = c.parent_id
                where c.doc_type = $1
            )
            select $1, coalesce(s.source_key, ch.source_key),
                   case when ch.source_key is null then 'missing'
                        when s.source_key is null then 'extra'
                        when s.text is distinct from ch.text then 'stale text'
                        when s.metadata is distinct from ch.metadata then 'stale metadata'
                        when s.parent_key is distinct from ch.parent_key
                          or ($2 is not null and ch.linked_key is distinct from ch.parent_key)
                          then 'wrong parent'
                   end
            from src s
            full join ch on ch.source_key = s.source_key
            where ch.source_key is null or s.source_key is null
               or s.text is distinct from ch.text
               or s.metadata is distinct from ch.metadata
               or s.parent_key is distinct from ch.parent_key
               or ($2 is not null and ch.linked_key is distinct from ch.parent_key)
            order by 2
            $sql$,
            'render_' || t.name)
        using t.name, t.parent_type;
    end loop;
end
$fn$;

comment on function pgrag.verify(text) is
    'Differences between the declared source views and the stored chunks (none = in sync)';


-- Regenerate every declared type's generated functions against this version of pgrag.
do $$
declare
    t record;
    w record;
begin
    for t in select d.name from pgrag.doc_types d
              where exists (select 1 from pg_class c where c.oid = d.source) loop
        perform pgrag.create_render_function(t.name);
    end loop;
    for w in select dw.doc_type, dw.source_table from pgrag.doc_watches dw
              where exists (select 1 from pg_class c where c.oid = dw.source_table) loop
        perform pgrag.create_sync_function(w.doc_type, w.source_table);
    end loop;
end
$$;
