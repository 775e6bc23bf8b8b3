-- Documents: declare, drop, refresh (render into pgrag.chunks), verify, and render what this
-- transaction changed before it commits (docs/documents.md).
--
-- A document type renders from a relation (a view, usually) with one row per document:
--   source_key (any type; stored as text), parent_key (only for child types), text, metadata jsonb
-- and watches the tables that feed it: for each, a key query over `changed` (the statement's
-- old and new rows of that table) yielding the keys of the documents to rebuild. Key queries
-- run with search_path = pg_catalog, pg_temp: schema-qualify every table in them.

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
--   tenant_column    a source column: each chunk's tenant (docs/security.md)
--   sensitive        {"column": "omit" | "mask"}: source columns whose values are cut out of the
--                    text and metadata (docs/security.md)
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

    -- replacing: only as (a member of) the role that declared it; remove the old triggers and
    -- generated view first (same transaction)
    select * into old from pgrag.doc_types d where d.name = declare_document.name;
    if found and not pgrag._may_act_as(old.owner) then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s, not to %s',
                             declare_document.name, old.owner, current_user),
            hint = format('declare it as %s (SET ROLE %s) or a member of it, or choose another '
                          'name', old.owner, old.owner);
    end if;
    if old.name is not null then
        for w in select * from pgrag.doc_watches dw where dw.doc_type = old.name loop
            perform pgrag._drop_sync_triggers(old.name, w.source_table);
        end loop;
        delete from pgrag.doc_watches dw where dw.doc_type = old.name;
        if old.owns_source and exists (select 1 from pg_class where oid = old.source) then
            execute format('drop view %s', old.source);
        end if;
    end if;

    -- the source: a relation, or a query pgrag turns into a view
    if source ~* '^\s*(select|with|values|table)\s' then
        begin
            perform pgrag._check_one_statement(format(E'select * from (%s\n) as s', source));
            execute format('create view pgrag_docs.%I as %s', view_name, source);
        exception when others then
            raise exception using errcode = 'PR003',
                message = format('the source query of %s does not compile: %s', declare_document.name, sqlerrm),
                hint = 'schema-qualify every table; the query must yield source_key, text[, parent_key][, metadata]';
        end;
        src := format('pgrag_docs.%I', view_name)::regclass;
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
    if tenant_column is null and exists (
        select 1 from pgrag.doc_types d where d.name = parent_type and d.tenant_column is not null
    ) then
        raise exception using errcode = 'PR003',
            message = format('%s is a child of %s, which has a tenant column, but has none itself',
                             declare_document.name, parent_type),
            hint = 'pass tenant_column => ... so its chunks are tenant-scoped like their parents';
    end if;
    select string_agg(d.name, ', ' order by d.name) into bad
      from pgrag.doc_types d
     where tenant_column is not null and d.parent_type = declare_document.name
       and d.tenant_column is null;
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

    -- The declaring role owns the type: its generated functions are that role's and run with
    -- its rights (row-level security on pgrag.doc_types lets a role record itself only).
    insert into pgrag.doc_types as d (name, source, owns_source, key_type, parent_type,
                                      metadata_schema, tenant_column, sensitive, owner)
    values (declare_document.name, src, owns, ktype, parent_type, metadata_schema, tenant_column,
            sensitive, current_user::regrole)
    on conflict on constraint doc_types_pkey do update
    set source = excluded.source, owns_source = excluded.owns_source, key_type = excluded.key_type,
        parent_type = excluded.parent_type, metadata_schema = excluded.metadata_schema,
        tenant_column = excluded.tenant_column, sensitive = excluded.sensitive,
        owner = excluded.owner, updated_at = now();
    update pgrag.doc_stats s set owner = current_user::regrole
     where s.doc_type = declare_document.name and s.owner <> current_user::regrole;
    perform pgrag._create_render_function(declare_document.name);
    if exists (select from pgrag.doc_stats s where s.doc_type = declare_document.name) then
        perform pgrag._create_stats_function(declare_document.name);
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
            perform pgrag._check_one_statement(format(
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
        perform pgrag._create_sync_triggers(declare_document.name, tbl);
    end loop;

    -- A re-declaration that changes the tenant column or the sensitive columns re-renders the
    -- type's chunks now, in this transaction: the stored ones carry the old tenant (NULL: every
    -- reader's) and the old masking, and must not outlive the declaration that replaced them.
    if old.name is not null
       and (old.tenant_column, old.sensitive) is distinct from (tenant_column, sensitive) then
        perform pgrag.refresh(declare_document.name);
    end if;
end
$fn$;

comment on function pgrag.declare_document(text, text, jsonb, text, jsonb, text, jsonb) is
    'Declare or replace a document type: its source view, watched tables and key queries, parent '
    'type, tenant column and sensitive columns';


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
    if not pgrag._may_act_as(t.owner) then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s, not to %s',
                             t.name, t.owner, current_user),
            hint = format('drop it as %s (SET ROLE %s) or a member of it', t.owner, t.owner);
    end if;
    select string_agg(d.name, ', ') into children from pgrag.doc_types d where d.parent_type = t.name;
    if children is not null then
        raise exception using errcode = 'PR003',
            message = format('document type %s is the parent of %s', t.name, children),
            hint = 'drop the child types first';
    end if;
    for w in select * from pgrag.doc_watches dw where dw.doc_type = t.name loop
        perform pgrag._drop_sync_triggers(t.name, w.source_table);
    end loop;
    if not keep_chunks then
        delete from pgrag.chunks c where c.doc_type = t.name;
        get diagnostics n = row_count;
    end if;
    delete from pgrag.doc_types d where d.name = t.name;
    -- its generated functions, trigger functions of tables dropped meanwhile included
    for w in select p.oid::regprocedure as fn from pg_proc p
              where p.pronamespace = 'pgrag_docs'::regnamespace
                and (p.proname in (pgrag._generated('render', t.name),
                                   pgrag._generated('store', t.name),
                                   pgrag._generated('list', t.name),
                                   pgrag._generated('stats', t.name))
                     or p.proname ~ ('^(sync|keys)_' || t.name || '_[0-9a-f]{10}$')) loop
        execute format('drop function if exists %s', w.fn);
    end loop;
    if t.owns_source and exists (select 1 from pg_class where oid = t.source) then
        execute format('drop view %s', t.source);
    end if;
    return n;
end
$fn$;

comment on function pgrag.drop_document(text, boolean) is
    'Remove a document type: its triggers, its generated view, its chunks; nothing else';


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
    execute format('select pgrag_docs.%I($1::text[])', pgrag._generated('store', doc_type))
       into n using keys;
    return n;
end
$fn$;

comment on function pgrag.refresh(text, text[]) is
    'Render documents of a type (all, or those with the given source keys) into pgrag.chunks';


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
                from pgrag_docs.%I(null::text[]) as r
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
            pgrag._generated('render', t.name))
        using t.name, t.parent_type;
    end loop;
end
$fn$;

comment on function pgrag.verify(text) is
    'Differences between the declared source views and the stored chunks (none = in sync)';


create or replace function pgrag.document_keys(doc_type text)
returns setof text
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Every source key a document type renders, in key order (for batched rebuilds), printed as the
-- render prints them: pgrag_docs.list_<type>(), which runs the source view as its declarer.
begin
    if not exists (select from pgrag.doc_types d where d.name = document_keys.doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', document_keys.doc_type),
            hint = '`pgrag documents list` shows the declared types';
    end if;
    return query execute format('select k from pgrag_docs.%I() k',
                                pgrag._generated('list', document_keys.doc_type));
end
$fn$;

comment on function pgrag.document_keys(text) is
    'Every source key a document type renders, as pgrag prints keys (for batched rebuilds)';


-- Sync at commit: render every document a transaction changed once, when it commits.
-- docs/documents.md (Sync) and docs/reliability.md (Deadlocks) explain why.
--
-- A watched table's statement trigger (generated by 10_documents_int.sql) queues the keys its key
-- query found and the statement's changed rows in pgrag.sync_queue, and inserts the
-- transaction's marker into pgrag.sync_pending (once: on conflict do nothing). The marker's
-- constraint trigger is DEFERRABLE INITIALLY DEFERRED, so it fires at commit, once, and renders
-- the queue (pgrag.sync_now):
--   1. one exclusive lock per document type it queued, all first, in name order (shared by all
--      transactions): two committing transactions never wait for each other in a cycle, and
--      the keys step 3 finds later are covered by the locks already held;
--   2. the renders, parents before children, each from a fresh snapshot;
--   3. the key queries again, over the queued rows, on a fresh snapshot: a concurrent commit may
--      have moved rows into documents the statements did not know of. Repeat until none is new.
-- At commit the transaction takes no new row lock on any source table, and chunk rows are only
-- written under their document's lock (the worker skips locked rows), so pgrag adds no
-- deadlock to a transaction of several statements, which rendering per statement did.
--
-- `set pgrag.sync = immediate` renders per statement instead (a session that reads its own
-- chunks before committing); `select pgrag.sync_now()` renders the queue mid-transaction, as
-- does `set constraints pgrag.pgrag_sync_at_commit immediate` (then after every statement).

create or replace function pgrag.sync_now()
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render every document this transaction queued so far (the commit-time trigger calls it; a
-- session may call it to read its own chunks before committing). Returns the number of
-- documents rendered (a TRUNCATE's full refresh counts one). A failed render raises PR004
-- naming the type and keys (see pgrag.run_sync); deadlocks and serialization failures keep
-- their SQLSTATE.
declare
    me xid8 := pg_current_xact_id_if_assigned();
    queued pgrag.sync_queue[];
    todo jsonb;           -- {doc_type: [keys] | null (all)}: still to render
    done jsonb := '{}';   -- the same: rendered
    t record;
    item pgrag.sync_queue;
    keys text[];
    found_keys text[];
    origin pgrag.sync_queue;
    n bigint := 0;
begin
    if me is null then
        return 0;  -- this transaction wrote nothing, so it queued nothing
    end if;
    delete from pgrag.sync_pending p where p.xid = me;
    with gone as (delete from pgrag.sync_queue s where s.xid = me returning s as gone_row)
    select array_agg(g.gone_row order by (g.gone_row).seq) into queued from gone g;
    if queued is null then
        return 0;
    end if;

    -- what the statements found, per type still declared (NULL: all of it, after a TRUNCATE)
    select coalesce(jsonb_object_agg(g.doc_type,
                                     case when g.all_keys then 'null'::jsonb
                                          else to_jsonb(g.keys) end), '{}')
      into todo
      from (select q.doc_type, bool_or(q.keys is null) as all_keys,
                   array_agg(distinct k order by k) filter (where k is not null) as keys
              from unnest(queued) q
              left join lateral unnest(q.keys) as u(k) on true
             where exists (select 1 from pgrag.doc_types d where d.name = q.doc_type)
             group by q.doc_type) g;

    loop
        -- 1. the key queries again over the queued rows, on a fresh snapshot: what they add
        --    now is locked with the rest, in order; what they add after the renders below is
        --    a concurrent commit's move that happened meanwhile
        foreach item in array queued loop
            continue when item.changed is null
                       or jsonb_typeof(done -> item.doc_type) = 'null'
                       or jsonb_typeof(todo -> item.doc_type) = 'null'
                       or to_regprocedure(format('pgrag_docs.%I(text)', pgrag._generated(
                              'keys', item.doc_type, item.source_table))) is null;
            execute format('select pgrag_docs.%I($1::text)',
                           pgrag._generated('keys', item.doc_type, item.source_table))
               into found_keys using item.changed;
            found_keys := array(select k from unnest(found_keys) as u(k)
                                except select jsonb_array_elements_text(
                                           coalesce(done -> item.doc_type, '[]'))
                                except select jsonb_array_elements_text(
                                           coalesce(todo -> item.doc_type, '[]')));
            if cardinality(found_keys) > 0 then
                todo := jsonb_set(todo, array[item.doc_type],
                                  coalesce(todo -> item.doc_type, '[]') || to_jsonb(found_keys));
            end if;
        end loop;
        exit when todo = '{}';

        -- 2. all locks first, in the one global order: one exclusive lock per document type,
        --    every type this transaction queued, by name. A type's lock covers all of its
        --    documents, so the keys step 1 finds on a later round (a concurrent commit moved
        --    rows meanwhile) need no new lock: no lock is ever taken out of order, and two
        --    committing transactions cannot wait on each other. The price: commit-time renders
        --    of one type run one at a time (docs/reliability.md). Re-taking a held lock is
        --    free; store_<type> then takes its bucket locks under it.
        for t in select distinct q.doc_type from unnest(queued) q order by q.doc_type loop
            perform pg_advisory_xact_lock(hashtext('pgrag document ' || t.doc_type)::bigint);
        end loop;

        -- 3. render, parents before children (a child's parent_id resolves to its parent's
        --    new chunk); the error names the first statement that queued the type
        for t in with recursive chain(name, depth) as (
                     select d.name, 0 from pgrag.doc_types d where d.parent_type is null
                     union all
                     select d.name, c.depth + 1
                       from pgrag.doc_types d join chain c on d.parent_type = c.name
                      where c.depth < 64)
                 select e.key as doc_type, e.value,
                        (select max(c.depth) from chain c where c.name = e.key) as depth
                   from jsonb_each(todo) e
                  order by 3 nulls last, 1 loop
            keys := case when jsonb_typeof(t.value) = 'null' then null
                         else array(select jsonb_array_elements_text(t.value)) end;
            select * into origin from unnest(queued) u where u.doc_type = t.doc_type
             order by u.seq limit 1;
            perform pgrag._run_sync(t.doc_type, keys, origin.op, origin.source_table);
            n := n + coalesce(cardinality(keys), 1);
            done := jsonb_set(done, array[t.doc_type],
                              case when keys is null or jsonb_typeof(done -> t.doc_type) = 'null'
                                   then 'null'::jsonb
                                   else coalesce(done -> t.doc_type, '[]') || t.value end);
        end loop;
        todo := '{}';
    end loop;
    return n;
end
$fn$;

comment on function pgrag.sync_now() is
    'Render the documents this transaction queued (done at commit anyway; call it to read '
    'your own chunks before committing)';

