-- Documents, internals: sensitive values cut out at render time, the functions pgrag generates for
-- every declared type, the sync triggers, and the commit-time render of what a transaction
-- changed (docs/documents.md, docs/reliability.md).
--
-- For every declared type pgrag generates, as static SQL inside plpgsql with cached generic
-- plans (a document view can take ~8 ms to plan; a session plans it once), with the settings a
-- key's text depends on pinned (pgrag._pin_output_settings):
--   pgrag.render_<type>(keys)    the source view filtered by keys
--   pgrag.store_<type>(keys)     render + upsert + delete + re-link children + NOTIFY
--   pgrag.sync_<type>_<hash>()   the trigger function of one watched table (key query inlined)
--   pgrag.keys_<type>_<hash>(rows) the key query over queued rows, asked again at commit
-- 99_generated.sql regenerates them whenever these files are applied.

create or replace function pgrag._redact_text(t text, secrets jsonb, modes jsonb)
returns text
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- secrets {"column": value}, modes {"column": "omit" | "mask"}: every string, number or boolean
-- inside each column's value (a scalar, an array, an object) is cut out of t wherever it occurs,
-- ignoring case (PostgreSQL's case-insensitive regular expression matching): removed (omit) or
-- replaced by [masked <column>] (mask). Longest values first.
-- One pass is not enough: cutting a value out may join its neighbours into another occurrence
-- ('secsecretret' without 'secret' is 'secret'), and a marker next to text may spell a value.
-- So passes repeat until no value occurs. If that does not settle in a few passes (a value
-- inside a marker, e.g. a masked value 'masked'), it starts again from t omitting every value,
-- which ends: each pass that finds one shortens the text. What is returned holds no value.
declare
    vals text[];
    repls text[];
    i int;
    pass int := 0;
    before text;
    original text := t;
    omit_all boolean := false;
begin
    if t is null then
        return null;
    end if;
    select array_agg(v.val order by length(v.val) desc, v.val),
           array_agg(case m.value #>> '{}' when 'omit' then ''
                          else replace(format('[masked %s]', m.key), '\', '\\') end
                     order by length(v.val) desc, v.val)
      into vals, repls
      from jsonb_each(modes) m
      cross join lateral (
          select x #>> '{}' as val
          from jsonb_path_query(coalesce(secrets -> m.key, 'null'), 'strict $.**') x
          where jsonb_typeof(x) in ('string', 'number', 'boolean')) v
     where v.val <> '';
    if vals is null then
        return t;
    end if;
    -- A value inside its own marker (a masked 'a' in '[masked email]') would grow the text at
    -- every pass: omit every value from the start instead.
    omit_all := exists (select 1 from unnest(vals) v, unnest(repls) r where r ~* ('***=' || v));
    -- ***= : the value is a literal, not a regular expression
    while exists (select 1 from unnest(vals) v where t ~* ('***=' || v)) loop
        pass := pass + 1;
        if (pass > 8 or length(t) > 2 * length(original) + 1000) and not omit_all then
            -- not settling (or growing): start again, omitting every value
            omit_all := true;
            t := original;
        end if;
        before := t;
        for i in 1 .. cardinality(vals) loop
            t := regexp_replace(t, '***=' || vals[i], case when omit_all then '' else repls[i] end,
                                'gi');
        end loop;
        if t = before then
            pass := 8;  -- a marker equal to a value: the next pass omits
        end if;
    end loop;
    return t;
end
$$;

comment on function pgrag._redact_text(text, jsonb, jsonb) is
    'A text with the values of sensitive columns cut out (omit) or replaced by [masked <column>]';


create or replace function pgrag._redact_jsonb(j jsonb, secrets jsonb, modes jsonb)
returns jsonb
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- pgrag.redact_text on every key and scalar of a JSON value; a number or boolean holding a
-- sensitive value becomes the mask string.
declare
    s text;
begin
    case jsonb_typeof(j)
        when 'object' then
            return (select coalesce(jsonb_object_agg(pgrag._redact_text(e.key, secrets, modes),
                                                     pgrag._redact_jsonb(e.value, secrets, modes)),
                                    '{}'::jsonb)
                    from jsonb_each(j) e);
        when 'array' then
            return (select coalesce(jsonb_agg(pgrag._redact_jsonb(e.value, secrets, modes)
                                              order by e.n), '[]'::jsonb)
                    from jsonb_array_elements(j) with ordinality e(value, n));
        when 'string' then
            return to_jsonb(pgrag._redact_text(j #>> '{}', secrets, modes));
        when 'number', 'boolean' then
            s := pgrag._redact_text(j #>> '{}', secrets, modes);
            return case when s = j #>> '{}' then j else to_jsonb(s) end;
        else
            return j;
    end case;
end
$$;

comment on function pgrag._redact_jsonb(jsonb, jsonb, jsonb) is
    'pgrag.redact_text on every key and scalar of a JSON value (chunk metadata)';


create or replace function pgrag._create_render_function(doc_type text)
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
    secrets text;
begin
    select * into strict t from pgrag.doc_types d where d.name = doc_type;
    select jsonb_object_agg(attname, format_type(atttypid, atttypmod)) into cols
      from pg_attribute where attrelid = t.source and attnum > 0 and not attisdropped;
    key_type := cols->>'source_key';
    pk_expr := case when cols ? 'parent_key' then 'd.parent_key::text' else 'null::text' end;
    md_expr := case when cols ? 'metadata' then 'coalesce(d.metadata, ''{}''::jsonb)'
                    else '''{}''::jsonb' end;
    if t.tenant_column is not null then
        -- '' for a missing tenant: a tenant-scoped document no reader's tenant matches
        tenant_expr := format('coalesce(d.%I::text, '''')', t.tenant_column);
    end if;
    if t.sensitive <> '{}' then
        -- Sensitive values are cut out of the text and metadata here, before anything stores them.
        select format('jsonb_build_object(%s)', string_agg(format('%L, d.%I', k, k), ', ' order by k))
          into secrets from jsonb_object_keys(t.sensitive) k;
        body_expr := format('pgrag._redact_text(%s, %s, %L::jsonb)', body_expr, secrets, t.sensitive);
        md_expr := format('pgrag._redact_jsonb(%s, %s, %L::jsonb)', md_expr, secrets, t.sensitive);
    end if;
    render_fn := format('pgrag.%I', 'render_' || t.name);

    -- Replaced in place, which keeps its owner (the role that declared the type: a migration
    -- regenerating it must not take it over, or that role could no longer re-declare or drop
    -- the type). Dropped first only when its result differs, then given back to its owner.
    old_owner := (select p.proowner::regrole from pg_proc p
                   where p.oid = to_regprocedure(render_fn || '(text[])'));
    if old_owner is not null
       and pg_get_function_result(to_regprocedure(render_fn || '(text[])'))
           is distinct from 'TABLE(key text, parent text, body text, meta jsonb, tenant text)' then
        execute format('drop function %s(text[])', render_fn);
    end if;
    execute pgrag._pin_output_settings(format($f$
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
                       (doc_type, source_key, parent_key, parent_id, text, metadata, tenant)
                select %2$L, s.key, s.parent,
                       (select p.id from pgrag.chunks p
                         where p.doc_type = %3$L and p.source_key = s.parent),
                       s.body, s.meta, s.tenant
                from src s
                on conflict (doc_type, source_key) do update
                set text = excluded.text,
                    metadata = excluded.metadata,
                    parent_key = excluded.parent_key,
                    parent_id = excluded.parent_id,
                    tenant = excluded.tenant,
                    embedding = case when c.text = excluded.text then c.embedding end,
                    embedding_model = case when c.text = excluded.text then c.embedding_model end,
                    embedded_at = case when c.text = excluded.text then c.embedded_at end,
                    updated_at = now()
                where (c.text, c.metadata, c.parent_key, c.parent_id, c.tenant)
                      is distinct from (excluded.text, excluded.metadata, excluded.parent_key,
                                        excluded.parent_id, excluded.tenant)
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
            $u$, render_fn, t.name, t.parent_type);

    execute pgrag._pin_output_settings(format($f$
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


create or replace function pgrag._run_sync(doc_type text, keys text[], op text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- What every generated trigger function does once it has the keys: refresh them, and turn a
-- failure into an error that names the document type and keys (the statement is aborted).
-- A type with sensitive columns gets the SQLSTATE only: the message of an
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
                             case when coalesce((select d.sensitive from pgrag.doc_types d
                                                 where d.name = doc_type), '{}') <> '{}'
                                  then format('error %s (message withheld: %s has sensitive'
                                              ' columns; run pgrag.refresh(%L) to see it)',
                                              sqlstate, doc_type, doc_type)
                                  else sqlerrm end),
            hint = format('fix the document view %s or the data; the statement was rolled back',
                          (select d.source::text from pgrag.doc_types d where d.name = doc_type));
end
$fn$;


create or replace function pgrag._sync_function_name(doc_type text, source_table regclass)
returns text
language sql stable strict security invoker
set search_path = pg_catalog, pg_temp
-- by the table's qualified name, not its OID, so the name survives a dump and restore
return (select format('sync_%s_%s', doc_type, left(md5(n.nspname || '.' || c.relname), 10))
          from pg_class c join pg_namespace n on n.oid = c.relnamespace
         where c.oid = source_table);


create or replace function pgrag._create_sync_function(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create the trigger function of one watched table: the key query inlined as static SQL
-- over the statement's transition rows (`changed`), then the keys and the changed rows are
-- queued for the commit-time render (pgrag.sync_now); with `set pgrag.sync = immediate`
-- pgrag._run_sync renders them at once. `set pgrag.sync = off` in a session skips it (bulk
-- loads); run pgrag.refresh(type) after. Also pgrag.keys_<type>_<hash>(changed rows): the key
-- query over queued rows, which the commit-time render asks again on a fresh snapshot.
declare
    kq text;
    keys_sql text := E'select array_agg(distinct q.k::text) into keys from (%s\n) as q(k) where q.k is not null';
    queue_block text := '';
begin
    select w.key_query into strict kq
      from pgrag.doc_watches w
     where w.doc_type = _create_sync_function.doc_type
       and w.source_table = _create_sync_function.source_table;
    -- One SELECT, also for key queries stored before declarations checked this. Checking
    -- plans the query, and planning may run immutable functions it calls: so only as the role
    -- that owns the trigger function already (or when there is none yet, at declaration), never
    -- as a migrating role regenerating a function another role declared.
    begin
        if coalesce((select p.proowner = (select oid from pg_roles where rolname = current_user)
                       from pg_proc p
                      where p.oid = to_regprocedure(format('pgrag.%I()',
                                        pgrag._sync_function_name(doc_type, source_table)))),
                    true) then
            perform pgrag._check_one_statement(format(
                E'with changed as (select * from %s limit 0) select q.k from (%s\n) as q(k)',
                source_table, kq));
        end if;
    exception when others then
        raise exception using errcode = 'PR003',
            message = format('the key query of %s for %s is not one SELECT: %s',
                             doc_type, source_table, sqlerrm),
            hint = 'declare the type again with a key query that is one SELECT, or drop it';
    end;
    begin
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
        execute pgrag._pin_output_settings(format($f$
            create or replace function pgrag.%1$I(changed_rows text)
            returns text[]
            language plpgsql volatile security invoker
            set search_path = pg_catalog, pg_temp
            @pinned_settings@
            as %2$L
            $f$,
            regexp_replace(pgrag._sync_function_name(doc_type, source_table), '^sync_', 'keys_'),
            format($body$
            declare
                keys text[];
            begin
                with changed as (select * from unnest(changed_rows::%1$s[])) %2$s;
                return keys;
            end
            $body$, source_table, format(keys_sql, kq))));
    end;
    -- The body goes in as a quoted literal (%L), never between dollar quotes: a key query that
    -- contains `$body$` cannot end the body early and add code of its own.
    execute pgrag._pin_output_settings(format($f$
        create or replace function pgrag.%1$I()
        returns trigger
        language plpgsql volatile security invoker
        set search_path = pg_catalog, pg_temp
        @pinned_settings@
        as %2$L
        $f$,
        pgrag._sync_function_name(doc_type, source_table),
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
                perform pgrag._run_sync(%2$L, null, tg_op, tg_relid::regclass);
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
                perform pgrag._run_sync(%2$L, keys, tg_op, tg_relid::regclass);
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


create or replace function pgrag._drop_sync_triggers(doc_type text, source_table regclass)
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
    if pgrag._sync_function_name(doc_type, source_table) is not null then
        execute format('drop function if exists pgrag.%I()',
                       pgrag._sync_function_name(doc_type, source_table));
        execute format('drop function if exists pgrag.%I(text)',
                       regexp_replace(pgrag._sync_function_name(doc_type, source_table),
                                      '^sync_', 'keys_'));
    end if;
end
$fn$;


create or replace function pgrag._create_sync_triggers(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
declare
    prefix text := format('pgrag_%s_', doc_type);
    fn text := format('pgrag.%I', pgrag._sync_function_name(doc_type, source_table));
begin
    perform pgrag._create_sync_function(doc_type, source_table);
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


create or replace function pgrag._sync_at_commit()
returns trigger
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The deferred constraint trigger on pgrag.sync_pending: fires once per transaction that
-- queued documents, at commit (or at SET CONSTRAINTS ... IMMEDIATE).
begin
    perform pgrag.sync_now();
    return null;
end
$fn$;


-- The marker's deferred trigger (revision 0007's tables): created once, re-pointed only when it
-- calls another function (dropping a trigger locks pgrag.sync_pending, which every writing
-- transaction touches).
do $$
begin
    if not exists (select from pg_trigger
                    where tgrelid = 'pgrag.sync_pending'::regclass
                      and tgname = 'pgrag_sync_at_commit'
                      and tgfoid = 'pgrag._sync_at_commit()'::regprocedure) then
        drop trigger if exists pgrag_sync_at_commit on pgrag.sync_pending;
        create constraint trigger pgrag_sync_at_commit
            after insert on pgrag.sync_pending
            deferrable initially deferred
            for each row execute function pgrag._sync_at_commit();
    end if;
end
$$;
