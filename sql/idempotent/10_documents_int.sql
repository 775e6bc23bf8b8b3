-- Documents, internals: sensitive values cut out at render time, the functions pgrag generates for
-- every declared type, the sync triggers, and the commit-time render of what a transaction
-- changed (docs/documents.md, docs/reliability.md).
--
-- For every declared type pgrag generates, in schema pgrag_docs, as static SQL inside plpgsql
-- with cached generic plans (a document view can take ~8 ms to plan; a session plans it once),
-- with the settings a key's text depends on pinned (pgrag._pin_output_settings):
--   render_<type>(keys)       the source view filtered by keys
--   store_<type>(keys)        render + upsert + delete + re-link children + NOTIFY
--   list_<type>()             every source key (pgrag.document_keys)
--   sync_<type>_<hash>()      the trigger function of one watched table (key query inlined)
--   keys_<type>_<hash>(rows)  the key query over queued rows, asked again at commit
--   stats_<type>(filter, doc_types)  the type's declared statistics (40_stats_int.sql)
-- Each is a security definer function owned by the role that declared the type: what that role
-- declared (its view, key queries, statistics) runs with its rights and no one else's, whoever
-- triggers it, as PostgreSQL runs a view with its owner's rights (docs/security.md). They take
-- keys, rows or a filter (compiled by pgrag), never SQL text. 99_generated.sql regenerates them,
-- acting as each type's owner, whenever these files are applied.

create or replace function pgrag._sensitive_forms(col name, typ oid)
returns text
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The SQL expression (over the source row `d`) of every text form a sensitive column's value
-- takes, as a JSON array pgrag._redact_text cuts out of a document: its JSON form (to_jsonb:
-- timestamps as 2024-03-04T05:06:07+00:00), its text (as the source view prints it: with the
-- render's pinned settings, 2024-03-04 05:06:07+00), and for an array its elements', for a range
-- its bounds', for json its keys too. A value printed otherwise by the view (to_char, a format of
-- its own) is not found: expose that formatted expression as the sensitive column instead.
declare
    t pg_type;
    v text := format('d.%I', col);
    forms text[];
begin
    select * into strict t from pg_type where oid = typ;
    while t.typtype = 'd' loop  -- a domain: its base type's forms
        select * into strict t from pg_type where oid = t.typbasetype;
    end loop;
    forms := array[format('to_jsonb(%s)', v), format('to_jsonb(%s::text)', v)];
    if t.typcategory = 'A' then
        forms := forms || format('to_jsonb(array(select e::text from unnest(%s) e))', v);
    elsif t.typtype = 'r' then
        forms := forms || format('jsonb_build_array(lower(%1$s)::text, upper(%1$s)::text)', v);
    elsif t.typtype = 'm' then
        forms := forms || format('(select jsonb_agg(jsonb_build_array(lower(r)::text, '
                                 'upper(r)::text)) from unnest(%s) r)', v);
    elsif t.oid in ('json'::regtype, 'jsonb'::regtype) then
        forms := forms || format('(select jsonb_agg(k) from jsonb_path_query(%s::jsonb, '
                                 '''strict $.** ? (@.type() == "object").keyvalue().key'') k)', v);
    end if;
    return format('jsonb_build_array(%s)', array_to_string(forms, ', '));
end
$fn$;

comment on function pgrag._sensitive_forms(name, oid) is
    'The expression of every text form a sensitive column''s value takes (redacted at render)';


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
-- pgrag._redact_text on every key and scalar of a JSON value; a number or boolean holding a
-- sensitive value becomes the mask string (or, omitted, goes with its entry).
declare
    s text;
begin
    -- Omitted means absent: an entry (or element) whose key or value redaction emptied (a
    -- string, an array, an object) is left out: an "ssn": "" where the value existed, and
    -- nothing where it was NULL, would tell which rows have one. One that was empty stays.
    case jsonb_typeof(j)
        when 'object' then
            return (select coalesce(jsonb_object_agg(r.key, r.value), '{}'::jsonb)
                      from jsonb_each(j) e
                      cross join lateral (select pgrag._redact_text(e.key, secrets, modes) as key,
                                                 pgrag._redact_jsonb(e.value, secrets, modes)
                                                     as value) r
                     where not ((r.key = '' and e.key <> '')
                                or (r.value in ('""', '[]', '{}') and e.value <> r.value)));
        when 'array' then
            return (select coalesce(jsonb_agg(r.value order by e.n), '[]'::jsonb)
                      from jsonb_array_elements(j) with ordinality e(value, n)
                      cross join lateral (select pgrag._redact_jsonb(e.value, secrets, modes)
                                                     as value) r
                     where not (r.value in ('""', '[]', '{}') and e.value <> r.value));
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


create or replace function pgrag._generated(kind text, doc_type text,
                                            source_table regclass default null)
returns text
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The name of a function generated for a declared type, in schema pgrag_docs: render_<type>,
-- store_<type>, list_<type> (its keys), stats_<type>; sync_<type>_<hash> (the trigger function
-- of one watched table) and keys_<type>_<hash> (its key query over queued rows), by the table's
-- qualified name, not its OID, so the name survives a dump and restore.
return case when kind in ('sync', 'keys')
            then (select format('%s_%s_%s', kind, doc_type,
                                left(md5(n.nspname || '.' || c.relname), 10))
                    from pg_class c join pg_namespace n on n.oid = c.relnamespace
                   where c.oid = source_table)
            else format('%s_%s', kind, doc_type) end;


create or replace function pgrag._claim_generated(name text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Before pgrag creates pgrag_docs.<name> for a type, as the role that declared it (the current
-- user): a function of that name (any arguments) another role owns is dropped if the current
-- user may (a superuser, a member of that role), else PR003 names it. A type's generated
-- functions run with their owner's rights, so they are never kept from a role pgrag did not
-- choose: a writer who created pgrag_docs.store_<type> first must not own the superuser's type.
declare
    f record;
begin
    for f in select p.oid::regprocedure as fn, p.proowner::regrole as owner
               from pg_proc p
              where p.pronamespace = 'pgrag_docs'::regnamespace and p.proname = name
                and p.proowner <> (select r.oid from pg_roles r where r.rolname = current_user) loop
        begin
            execute format('drop function %s', f.fn);
            raise notice 'pgrag dropped %, which belonged to role %: pgrag creates it as %',
                f.fn, f.owner, current_user;
        exception when insufficient_privilege or dependent_objects_still_exist then
            raise exception using errcode = 'PR003',
                message = format('%s belongs to role %s, not to %s, who declares the type',
                                 f.fn, f.owner, current_user),
                hint = format('drop it (as %s or a superuser), then declare the type again',
                              f.owner);
        end;
    end loop;
end
$fn$;

comment on function pgrag._claim_generated(text) is
    'Drop (or refuse) a function of a generated name that another role owns';


create or replace function pgrag._create_generated(name text, args text, ddl text,
                                                   readers boolean default false)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Create a generated function of a declared type (ddl: its CREATE OR REPLACE, a security
-- definer) as the current user, who declared the type; executable by the writer role (and the
-- reader role: readers), never by PUBLIC. A function of the same name but another result is
-- dropped first (CREATE OR REPLACE cannot change it).
declare
    s pgrag.settings;
    fn regprocedure;
begin
    perform pgrag._claim_generated(name);
    execute pgrag._pin_output_settings(ddl);
    fn := format('pgrag_docs.%I(%s)', name, args)::regprocedure;
    select * into strict s from pgrag.settings;
    execute format('revoke all on function %s from public', fn);
    execute format('grant execute on function %s to %s', fn,
                   case when readers then format('%I, %I', s.writer_role, s.reader_role)
                        else quote_ident(s.writer_role) end);
end
$fn$;


create or replace function pgrag._create_render_function(doc_type text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create pgrag_docs.render_<type>(keys), store_<type>(keys) and list_<type>() for a declared
-- type, as the role that declared it (the current user: pgrag.declare_document, or a migration
-- acting as that role). They are security definer functions owned by that role: the source view
-- and everything it calls run with the declarer's rights, whoever writes a watched table,
-- refreshes, rebuilds or verifies. Static SQL inside plpgsql: a session plans the view once.
declare
    t pgrag.doc_types;
    cols jsonb;
    pk_expr text;
    md_expr text;
    body_expr text := 'd.text::text';
    tenant_expr text := 'null::text';
    -- The key's exact type, modifiers included, from the catalog (never from doc_types text):
    -- `character(3)` as regtype would be `character`, i.e. char(1), and cut 'ABW' to 'A'.
    key_type text;
    upsert text;
    secrets text;
begin
    select * into strict t from pgrag.doc_types d where d.name = doc_type;
    if t.owner <> current_user::regrole then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s; %s may not generate its '
                             'functions', t.name, t.owner, current_user),
            hint = format('act as %s (SET ROLE %s), or declare the type again', t.owner, t.owner);
    end if;
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
        select format('jsonb_build_object(%s)',
                      string_agg(format('%L, %s', k, pgrag._sensitive_forms(k::name, a.atttypid)),
                                 ', ' order by k))
          into secrets
          from jsonb_object_keys(t.sensitive) k
          join pg_attribute a on a.attrelid = t.source and a.attname = k and not a.attisdropped;
        body_expr := format('pgrag._redact_text(%s, %s, %L::jsonb)', body_expr, secrets, t.sensitive);
        md_expr := format('pgrag._redact_jsonb(%s, %s, %L::jsonb)', md_expr, secrets, t.sensitive);
    end if;

    perform pgrag._create_generated(pgrag._generated('render', t.name), 'text[]', format($f$
        create or replace function pgrag_docs.%1$I(keys text[])
        returns table (key text, parent text, body text, meta jsonb, tenant text)
        language plpgsql stable security definer rows 10
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        -- security definer, owned by the role that declared the type: its view runs with that
        -- role's rights, whoever asks; it takes keys only (cast to the key type, never SQL).
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
                                         bad_key, %8$L, read_back, %7$L),
                        hint = 'did the key column''s type change since the declaration? '
                               'declare the type again to regenerate its functions';
                end if;
                return query select d.source_key::text, %2$s, %3$s, %4$s, %5$s from %6$s d
                             where d.source_key = any(keys::%7$s[]);
            end if;
        end
        $body$
        $f$,
        pgrag._generated('render', t.name), pk_expr, body_expr, md_expr, tenant_expr, t.source,
        key_type,  -- format_type() of the catalog: a type name, never SQL of doc_types'
        t.name));

    perform pgrag._create_generated(pgrag._generated('list', t.name), '', format($f$
        create or replace function pgrag_docs.%1$I()
        returns setof text
        language sql stable security definer
        set search_path = pg_catalog, pg_temp
        @pinned_settings@
        -- security definer, owned by the role that declared the type: every source key of the
        -- type, in key order, printed as the render prints them (pgrag.document_keys).
        as $body$ select d.source_key::text from %2$s d order by d.source_key $body$
        $f$, pgrag._generated('list', t.name), t.source));

    -- The upsert, with separate statements for "these keys" and "all" so each has a good
    -- cached plan (an `or keys is null` would make the keyed one scan the whole type).
    upsert := format($u$
            with src as materialized (
                select r.key, r.parent, r.body, r.meta, r.tenant from pgrag_docs.%1$I(keys) r
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
            $u$, pgrag._generated('render', t.name), t.name, t.parent_type);

    perform pgrag._create_generated(pgrag._generated('store', t.name), 'text[]', format($f$
        create or replace function pgrag_docs.%1$I(keys text[])
        returns bigint
        language plpgsql volatile security definer
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        -- security definer, owned by the role that declared the type: render (as that role) and
        -- store the documents of these keys (all when NULL). It takes keys only.
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
                perform pg_advisory_xact_lock(%5$s::bigint);
            else
                perform pg_advisory_xact_lock_shared(%5$s::bigint);
                perform pg_advisory_xact_lock(%5$s, b)
                   from (select distinct hashtext(k) & 255 as b from unnest(keys) as u(k)) d
                  order by b;
            end if;

            if keys is null then
                %2$s;
            else
                %3$s;
            end if;

            -- Children rendered before their parent existed find it now (the child types as
            -- declared now: a child declared later needs no new function here).
            if not exists (select from pgrag.doc_types c where c.parent_type = %4$L) then
                null;
            elsif keys is null then
                update pgrag.chunks ch
                   set parent_id = p.id
                  from pgrag.chunks p
                 where p.doc_type = %4$L
                   and ch.doc_type in (select c.name from pgrag.doc_types c
                                        where c.parent_type = %4$L)
                   and ch.parent_key = p.source_key
                   and ch.parent_id is distinct from p.id;
                get diagnostics n_linked = row_count;
            else
                update pgrag.chunks ch
                   set parent_id = p.id
                  from pgrag.chunks p
                 where p.doc_type = %4$L
                   and p.source_key = any(keys)
                   and ch.doc_type in (select c.name from pgrag.doc_types c
                                        where c.parent_type = %4$L)
                   and ch.parent_key = p.source_key
                   and ch.parent_id is distinct from p.id;
                get diagnostics n_linked = row_count;
            end if;

            if n_pending > 0 then
                perform pg_notify('pgrag_chunks', %4$L);
            end if;
            return n_up + n_gone + n_linked;
        end
        $body$
        $f$,
        pgrag._generated('store', t.name),
        format(upsert, 'true'),
        format(upsert, 'c.source_key = any(keys)'),
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


create or replace function pgrag._create_sync_function(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create the trigger function of one watched table, pgrag_docs.sync_<type>_<hash>(), and
-- its key query over queued rows, pgrag_docs.keys_<type>_<hash>(rows), as the role that
-- declared the type (the current user; security definer functions it owns: the key query runs
-- with its rights, whoever writes the table). The trigger function runs the key query over the
-- statement's transition rows (`changed`) and queues the keys with the changed rows for the
-- commit-time render (pgrag.sync_now); with `set pgrag.sync = immediate` pgrag._run_sync
-- renders them at once. `set pgrag.sync = off` in a session skips it (bulk loads); run
-- pgrag.refresh(type) after. Nothing here plans or runs the key query: a declaration checks it
-- as its declarer (pgrag.declare_document); a migration regenerating it only creates functions.
declare
    kq text;
    keys_sql text := E'select array_agg(distinct q.k::text) into keys from (%s\n) as q(k) where q.k is not null';
    queue_block text;
    owner regrole;
begin
    select w.key_query, d.owner into strict kq, owner
      from pgrag.doc_watches w join pgrag.doc_types d on d.name = w.doc_type
     where w.doc_type = _create_sync_function.doc_type
       and w.source_table = _create_sync_function.source_table;
    if owner <> current_user::regrole then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s; %s may not generate its '
                             'functions', doc_type, owner, current_user),
            hint = format('act as %s (SET ROLE %s), or declare the type again', owner, owner);
    end if;
    -- Queue the keys with the statement's rows (as the table's row type, in text), and this
    -- transaction's marker, whose deferred trigger renders the queue at commit.
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
    -- Bodies go in as quoted literals (%L), never between dollar quotes: a key query that
    -- contains `$body$` cannot end the body early and add code of its own.
    perform pgrag._create_generated(pgrag._generated('keys', doc_type, source_table), 'text',
        format($f$
            create or replace function pgrag_docs.%1$I(changed_rows text)
            returns text[]
            language plpgsql volatile security definer
            set search_path = pg_catalog, pg_temp
            @pinned_settings@
            as %2$L
            $f$,
            pgrag._generated('keys', doc_type, source_table),
            format($body$
            -- security definer, owned by the role that declared the type: its key query over
            -- queued rows (of this table's row type), as that role.
            declare
                keys text[];
            begin
                with changed as (select * from unnest(changed_rows::%1$s[])) %2$s;
                return keys;
            end
            $body$, source_table, format(keys_sql, kq))));
    perform pgrag._create_generated(pgrag._generated('sync', doc_type, source_table), '',
        format($f$
        create or replace function pgrag_docs.%1$I()
        returns trigger
        language plpgsql volatile security definer
        set search_path = pg_catalog, pg_temp
        @pinned_settings@
        as %2$L
        $f$,
        pgrag._generated('sync', doc_type, source_table),
        format($body$
        -- security definer, owned by the role that declared the type: the key query runs as
        -- that role, whoever writes the table.
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
-- Drop the sync triggers of one watched table and their generated functions (dropping a
-- trigger takes the table's owner; the functions, the type's declarer).
declare
    suffix text;
begin
    if exists (select 1 from pg_class where oid = source_table) then
        foreach suffix in array array['ins', 'upd', 'del', 'trn'] loop
            execute format('drop trigger if exists %I on %s',
                           format('pgrag_%s_%s', doc_type, suffix), source_table);
        end loop;
        execute format('drop function if exists pgrag_docs.%I()',
                       pgrag._generated('sync', doc_type, source_table));
        execute format('drop function if exists pgrag_docs.%I(text)',
                       pgrag._generated('keys', doc_type, source_table));
    end if;  -- else the table is gone, and its triggers with it (drop_document sweeps the rest)
end
$fn$;


create or replace function pgrag._create_sync_triggers(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- The trigger function of one watched table (pgrag._create_sync_function) and its four statement
-- triggers, created or re-pointed (CREATE OR REPLACE TRIGGER), as the role that declared the type.
declare
    prefix text := format('pgrag_%s_', doc_type);
    fn text := format('pgrag_docs.%I', pgrag._generated('sync', doc_type, source_table));
    t record;
begin
    perform pgrag._create_sync_function(doc_type, source_table);
    for t in select * from (values
        ('ins', 'after insert on %s referencing new table as pgrag_new'),
        ('upd', 'after update on %s referencing old table as pgrag_old new table as pgrag_new'),
        ('del', 'after delete on %s referencing old table as pgrag_old'),
        ('trn', 'after truncate on %s')) v(suffix, event) loop
        -- (unchanged: not re-created, which would lock the table against its writers)
        continue when exists (select from pg_trigger tg
                               where tg.tgrelid = source_table
                                 and tg.tgname = prefix || t.suffix
                                 and tg.tgfoid = (fn || '()')::regprocedure);
        execute format('create or replace trigger %I ' || t.event
                       || ' for each statement execute function %s()',
                       prefix || t.suffix, source_table, fn);
    end loop;
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
