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
    sensitive jsonb default '{}'::jsonb,
    sync text default null
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
--   sync             commit (render at the writer's commit) or queue (the worker renders);
--                    NULL: as declared before, else commit (docs/documents.md, Sync)
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
    plan json;
    reads regclass[];
    stats_owner regrole;
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
    if parent_type is not null and not exists (
        select from pgrag.doc_types d
         where d.name = parent_type and pgrag._may_act_as(d.owner)) then
        raise exception using errcode = 'PR003',
            message = format('parent type %s of %s belongs to role %s, which %s may not act as',
                             parent_type, declare_document.name,
                             (select d.owner from pgrag.doc_types d where d.name = parent_type),
                             current_user),
            hint = 'declare both types as the same role (SET ROLE to the writer role: '
                   'docs/security.md), or have the parent''s owner declare this one';
    end if;
    perform pgrag._refuse_temporary_objects();  -- (first: an error of its own)
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
    if sync is not null and sync not in ('commit', 'queue') then
        raise exception using errcode = 'PR003',
            message = format('sync %L of %s is not commit or queue', sync, declare_document.name),
            hint = 'commit: rendered at the writer''s commit; queue: rendered by the worker';
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
        if old.owns_source and pgrag._generated_view(old.source, old.name, old.owner) then
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
                hint = case when sqlstate = '42501'  -- (a privilege, not the query's shape)
                            then format('the declaring role %s reads the tables the query '
                                        'names: have their owner grant it SELECT', current_user)
                            else 'schema-qualify every table; the query must yield source_key, '
                                 'text[, parent_key][, metadata]' end;
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
                                      metadata_schema, tenant_column, sensitive, owner, sync)
    values (declare_document.name, src, owns, ktype, parent_type, metadata_schema, tenant_column,
            sensitive, current_user::regrole, coalesce(sync, old.sync, 'commit'))
    on conflict on constraint doc_types_pkey do update
    set source = excluded.source, owns_source = excluded.owns_source, key_type = excluded.key_type,
        parent_type = excluded.parent_type, metadata_schema = excluded.metadata_schema,
        tenant_column = excluded.tenant_column, sensitive = excluded.sensitive,
        owner = excluded.owner, sync = excluded.sync, updated_at = now();
    -- Statistics another role declared are never taken over: their SQL would run as this
    -- role (a superuser re-declaring a writer's type, as the watched table's owner must, ran
    -- the writer's statistics as itself). They are removed, to be declared again.
    select s.owner into stats_owner from pgrag.doc_stats s
     where s.doc_type = declare_document.name and s.owner <> current_user::regrole;
    if stats_owner is not null then
        delete from pgrag.doc_stats s where s.doc_type = declare_document.name;
        begin
            execute format('drop function if exists pgrag_docs.%I(jsonb, text[])',
                           pgrag._generated('stats', declare_document.name));
        exception when insufficient_privilege then
            null;  -- (its owner's; nothing calls it without the row, and a new declaration
                   -- of statistics replaces it or names it)
        end;
        raise warning using
            message = format('pgrag: the statistics of %s, declared by %s, were removed: they '
                             'would run as %s', declare_document.name, stats_owner, current_user),
            hint = format('declare them again (pgrag.declare_stats) as %s, or have %s do it',
                          current_user, stats_owner);
    end if;
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
                hint = case when sqlstate = '42501'
                            then format('the declaring role %s reads the tables the key query '
                                        'names: have their owner grant it SELECT', current_user)
                            else 'select the document keys from `changed` (the changed rows); '
                                 'schema-qualify other tables' end;
        end;
        -- The relations the key query reads besides `changed` (its plan; `changed` as an
        -- empty function scan): none means its keys depend on the changed rows alone.
        execute format(E'explain (verbose, format json) with changed as (select * from '
                       'unnest(null::%s[])) select q.k::text from (%s\n) as q(k)',
                       tbl, w.kq #>> '{}') into plan;
        reads := array(select distinct format('%I.%I', r ->> 'Schema', r ->> 'Relation Name')::regclass
                         from jsonb_path_query(plan::jsonb,
                                               'strict $.** ? (exists (@."Relation Name"))') r);
        insert into pgrag.doc_watches (doc_type, source_table, key_query, reads)
        values (declare_document.name, tbl, w.kq #>> '{}', reads);
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

comment on function pgrag.declare_document(text, text, jsonb, text, jsonb, text, jsonb, text) is
    'Declare or replace a document type: its source view, watched tables and key queries, parent '
    'type, tenant column, sensitive columns and sync mode';


create or replace function pgrag.set_sync(doc_type text, mode text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Switch a type between rendering at its writers' commit (commit) and by the worker (queue),
-- without re-declaring it: its trigger functions are regenerated (the triggers stay, so its
-- tables are not locked). As the role that declared it.
declare
    t pgrag.doc_types;
    w record;
begin
    t := pgrag._owned_type(doc_type, 'its sync mode');
    if mode is null or mode not in ('commit', 'queue') then
        raise exception using errcode = 'PR003',
            message = format('sync mode %s is not commit or queue', coalesce(mode, 'NULL')),
            hint = 'commit: rendered at the writer''s commit; queue: rendered by the worker';
    end if;
    update pgrag.doc_types d set sync = mode, updated_at = now() where d.name = t.name;
    for w in select dw.source_table from pgrag.doc_watches dw
              where dw.doc_type = t.name
                and exists (select from pg_class c where c.oid = dw.source_table) loop
        perform pgrag._create_sync_function(t.name, w.source_table);
    end loop;
end
$fn$;

comment on function pgrag.set_sync(text, text) is
    'Render a type''s documents at its writers'' commit (commit) or by the worker (queue)';


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
    delete from pgrag.render_queue q where q.doc_type = t.name;
    delete from pgrag.render_errors e where e.doc_type = t.name;
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
    if t.owns_source and pgrag._generated_view(t.source, t.name, t.owner) then
        execute format('drop view %s', t.source);
    end if;
    return n;
end
$fn$;

comment on function pgrag.drop_document(text, boolean) is
    'Remove a document type: its triggers, its generated view, its chunks; nothing else';


create or replace function pgrag.refresh(doc_type text, keys text[] default null,
                                         on_error text default 'record')
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render the documents of `doc_type` whose source_key is in `keys` (all of them when NULL)
-- into pgrag.chunks, set-based, in the caller's transaction, under their locks:
--   new or changed text  → upserted with embedding NULL (the worker re-embeds it), NOTIFY sent
--   unchanged text       → keeps its vector (metadata and parent link still refreshed)
--   key no longer in the source → its chunk is deleted (and, through the FK, its children)
-- A document whose render fails is recorded in pgrag.render_errors and skipped (on_error
-- 'record'), or raised as PR004 naming it ('raise').
-- Returns the number of chunks inserted, changed, deleted or re-linked.
begin
    if not exists (select 1 from pgrag.doc_types d where d.name = doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', doc_type),
            hint = 'declare it with pgrag.declare_document(...); `pgrag documents list` shows the declared ones';
    end if;
    if on_error is null or on_error not in ('record', 'raise') then
        raise exception using errcode = 'PR006',
            message = format('on_error %s is not record or raise', coalesce(on_error, 'NULL')),
            hint = 'record (skip a failing document, pgrag verify lists it) or raise';
    end if;
    if keys is not null and cardinality(keys) = 0 then
        return 0;
    end if;
    perform pgrag._lock_documents(jsonb_build_object(doc_type, to_jsonb(keys)), true);
    -- (the tsvectors written with the texts: only a commit's small render, when its session
    -- asks, leaves them)
    return pgrag._render_todo(jsonb_build_object(doc_type, to_jsonb(keys)), false, on_error);
end
$fn$;

comment on function pgrag.refresh(text, text[], text) is
    'Render documents of a type (all, or those with the given source keys) into pgrag.chunks';


create or replace function pgrag._verify_keys(doc_type text, keys text[])
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- pgrag.verify for the documents of these keys (all when NULL): [[key, problem], ...]. If the
-- render fails, the keys are compared by halves, down to the documents that fail alone, which
-- are reported as such (their error; withheld for a type with sensitive columns).
declare
    parent text := (select d.parent_type from pgrag.doc_types d where d.name = _verify_keys.doc_type);
    found jsonb;
    half integer;
    fn text;
    checked jsonb;
begin
    fn := pgrag._generated('render', doc_type);
    checked := pgrag._check_generated(
        array[fn], array[(select d.owner from pgrag.doc_types d
                           where d.name = _verify_keys.doc_type)]);
    begin
        execute format($sql$
            with src as (
                select r.key as source_key, r.parent as parent_key,
                       left(r.body, %2$s) as text, r.meta as metadata, true as rendered
                from pgrag_docs.%1$I($3) as r
            ),
            ch as (
                select c.source_key, c.parent_key, c.text, c.metadata, p.source_key as linked_key
                from pgrag.chunks c
                left join pgrag.chunks p on p.id = c.parent_id
                where c.doc_type = $1 and ($3 is null or c.source_key = any($3))
            )
            select coalesce(jsonb_agg(jsonb_build_array(
                       coalesce(s.source_key, ch.source_key),
                       case when s.rendered and s.source_key is null
                                 -- (rebuilds counted it and wrote nothing: say why)
                                 then 'a NULL source_key: the source gives a row without a '
                                      || 'key, which no chunk can hold (leave it out of the '
                                      || 'source, or give it a key)'
                            when s.source_key is not null and s.text is null
                                 -- (the store records it as 23502; "missing" sent users to
                                 -- a rebuild, which cannot help)
                                 then 'render failed (23502): the source gives this document '
                                      || 'a NULL text'
                            when ch.source_key is null then 'missing'
                            when s.source_key is null then 'extra'
                            when s.text is distinct from ch.text then 'stale text'
                            when s.metadata is distinct from ch.metadata then 'stale metadata'
                            else 'wrong parent' end)), '[]')
            from src s
            full join ch on ch.source_key = s.source_key
            where ch.source_key is null or s.source_key is null
               or s.text is distinct from ch.text
               or s.metadata is distinct from ch.metadata
               or s.parent_key is distinct from ch.parent_key
               or ($2 is not null and ch.linked_key is distinct from ch.parent_key)
            $sql$, pgrag._generated('render', doc_type), pgrag._limit('document_chars'))
        into found using doc_type, parent, keys;
        perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
        return found;
    exception
        when query_canceled or assert_failure then  -- (not caught by `when others`)
            perform pgrag._undo_prepared(checked);
            raise;
        when others then
            perform pgrag._undo_prepared(checked);
            if keys is not null and cardinality(keys) = 1 then
                return jsonb_build_array(jsonb_build_array(keys[1], format(
                    'render failed (%s): %s', sqlstate,
                    case when (select d.sensitive <> '{}' from pgrag.doc_types d
                                where d.name = _verify_keys.doc_type)
                         then 'message withheld: the type has sensitive columns'
                         else sqlerrm end)));
            end if;
    end;
    if keys is null then
        keys := array(select k from pgrag.document_keys(doc_type) k
                      union select c.source_key from pgrag.chunks c
                             where c.doc_type = _verify_keys.doc_type);
    end if;
    if cardinality(keys) = 0 then
        return '[]';
    end if;
    half := greatest(cardinality(keys) / 2, 1);
    return pgrag._verify_keys(doc_type, keys[1:half])
        || case when cardinality(keys) > half
                then pgrag._verify_keys(doc_type, keys[half + 1:]) else '[]' end;
end
$fn$;

comment on function pgrag._verify_keys(text, text[]) is
    'pgrag.verify for some documents, by halves past a render that fails';


create or replace function pgrag.verify(only_type text default null)
returns table (doc_type text, source_key text, problem text)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Compare every declared source view with the stored chunks. No rows means all is in sync.
-- problem: missing (in the view, no chunk), extra (a chunk the view no longer yields),
-- stale text, stale metadata, wrong parent, render failed (the document cannot be rendered:
-- its error; the others are compared all the same).
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
    -- A partitioned store's unique key holds the tenant, and its ids have no unique index
    -- (sql/migrate/store_shape.sql): a document stored under two tenants, or two chunks of
    -- one id, are what it does not prevent.
    if pgrag._store_partitioned() then
        return query
            select c.doc_type, c.source_key,
                   format('stored %s times (tenants %s)', count(*),
                          string_agg(coalesce(quote_literal(c.tenant), 'NULL'), ', '
                                     order by c.tenant))
              from pgrag.chunks c
             where only_type is null or c.doc_type = only_type
             group by c.doc_type, c.source_key having count(*) > 1
             order by 1, 2;
        return query
            select c.doc_type, c.source_key, format('id %s is held by another chunk too', c.id)
              from pgrag.chunks c
             where (only_type is null or c.doc_type = only_type)
               and c.id in (select d.id from pgrag.chunks d group by d.id having count(*) > 1)
             order by 1, 2;
    end if;
    for t in select * from pgrag.doc_types d
              where only_type is null or d.name = only_type
              order by d.parent_type nulls first, d.name loop
        if not exists (select 1 from pg_class where oid = t.source) then
            return query select t.name, null::text, 'source view is gone: re-declare the type';
            continue;
        end if;
        if not pgrag._may_run_declared(t.owner) then
            return query select t.name, null::text,
                format('not checked: declared by %s, whose SQL pgrag does not run in a '
                       'privileged session (verify as %s)', t.owner, t.owner);
            continue;
        end if;
        return query select t.name, p ->> 0, p ->> 1
                       from jsonb_array_elements(pgrag._verify_keys(t.name, null)) p
                      order by 2, 3;
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
declare
    fn text;
    checked jsonb;
begin
    if not exists (select from pgrag.doc_types d where d.name = document_keys.doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', document_keys.doc_type),
            hint = '`pgrag documents list` shows the declared types';
    end if;
    fn := pgrag._generated('list', document_keys.doc_type);
    checked := pgrag._check_generated(
        array[fn], array[(select d.owner from pgrag.doc_types d
                           where d.name = document_keys.doc_type)]);
    begin
        return query execute format('select k from pgrag_docs.%I() k', fn);
        perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
    exception
        when others or query_canceled or assert_failure then  -- (others: not the two)
            perform pgrag._undo_prepared(checked);  -- (a rollback keeps them)
            raise;
    end;
end
$fn$;

comment on function pgrag.document_keys(text) is
    'Every source key a document type renders, as pgrag prints keys (for batched rebuilds)';


create or replace function pgrag.describe_document(doc_type text, description text default null,
                                                   synonyms text[] default null,
                                                   keys jsonb default null)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Words for the question parser (docs/declaring.md): what the type is (description, synonyms:
-- the words a question uses for its documents, e.g. member, person) and, per metadata key,
-- {"description": "...", "synonyms": ["..."], "values": {"<a value>": ["<its synonyms>"]}}.
-- Replaces the type's previous description; NULL arguments keep what was described before.
declare
    t pgrag.doc_types;
    bad text;
    voc jsonb;
begin
    t := pgrag._owned_type(doc_type, 'its words');
    if keys is not null and jsonb_typeof(keys) <> 'object' then
        raise exception using errcode = 'PR003',
            message = format('keys of %s must be a JSON object {"key": {"synonyms": [...]}}',
                             doc_type),
            hint = 'e.g. {"segment": {"synonyms": ["tier"], "values": {"Dormant": ["inactive"]}}}';
    end if;
    select string_agg(k, ', ') into bad
      from jsonb_object_keys(coalesce(keys, '{}')) k where not t.metadata_schema ? k;
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('%s has no metadata key %s', doc_type, bad),
            hint = format('describe keys of its metadata_schema: %s',
                          (select string_agg(k, ', ' order by k)
                             from jsonb_object_keys(t.metadata_schema) k));
    end if;
    -- the shape: strings, lists of strings, objects of lists of strings (sizes checked below)
    select string_agg(format('%s.%s', e.key, f.key), ', ') into bad
      from jsonb_each(coalesce(keys, '{}')) e
      left join lateral jsonb_each(case when jsonb_typeof(e.value) = 'object' then e.value end) f
        on true
     where jsonb_typeof(e.value) <> 'object'
        or f.key not in ('description', 'synonyms', 'values')
        or (f.key = 'description' and jsonb_typeof(f.value) <> 'string')
        or (f.key = 'synonyms' and (jsonb_typeof(f.value) <> 'array' or exists (
                select from jsonb_array_elements(f.value) x where jsonb_typeof(x) <> 'string')))
        or (f.key = 'values' and (jsonb_typeof(f.value) <> 'object' or exists (
                select from jsonb_each(f.value) v
                 where jsonb_typeof(v.value) <> 'array' or exists (
                     select from jsonb_array_elements(v.value) x
                      where jsonb_typeof(x) <> 'string'))));
    if bad is not null then
        raise exception using errcode = 'PR003',
            message = format('keys of %s: %s not of the form {"description": "...", '
                             '"synonyms": ["..."], "values": {"value": ["..."]}}', doc_type, bad),
            hint = 'descriptions are strings; synonyms lists of strings; values an object of lists';
    end if;
    voc := jsonb_strip_nulls(jsonb_build_object(
        'description', coalesce(description, t.vocabulary->>'description'),
        'synonyms', coalesce(to_jsonb(synonyms), t.vocabulary->'synonyms'),
        'keys', coalesce(keys, t.vocabulary->'keys')));
    if length(voc::text) > 100000 or exists (
        select from jsonb_path_query(voc, 'strict $.**') x
         where jsonb_typeof(x) = 'string' and length(x #>> '{}') > 500) then
        raise exception using errcode = 'PR003',
            message = format('the description of %s is too long', doc_type),
            hint = 'at most 500 characters per word or description and 100,000 in all';
    end if;
    update pgrag.doc_types d set vocabulary = voc, updated_at = now()
     where d.name = describe_document.doc_type;
end
$fn$;

comment on function pgrag.describe_document(text, text, text[], jsonb) is
    'Describe a document type for the question parser: its description and synonyms, and its '
    'metadata keys'' descriptions, synonyms and value synonyms';


create or replace function pgrag.vocabulary(max_values integer default 5000)
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- What the question parser knows (pgrag.parse): per declared type its parent, metadata schema
-- and described words, and, for its text and text[] keys, the values present in the chunks this
-- session may see (row-level security: never another tenant's), each with how many documents
-- carry it: the max_values most frequent per key, and the key's number of distinct values.
-- For date and number keys, their smallest and largest values.
begin
    perform pgrag._check_range('max_values', max_values, 1, 100000);
    return (
        with keys as (
            select d.name as doc_type, s.key, s.value #>> '{}' as type
              from pgrag.doc_types d, jsonb_each(d.metadata_schema) s
        ),
        vals as (
            select c.doc_type, k.key, v.value, count(*) as n
              from keys k
              join pgrag.chunks c on c.doc_type = k.doc_type
             cross join lateral (
                 select c.metadata->>k.key as value
                  where jsonb_typeof(c.metadata->k.key) = 'string'
                 union all
                 select x from jsonb_array_elements_text(
                     case when jsonb_typeof(c.metadata->k.key) = 'array'
                          then c.metadata->k.key end) x) v
             where k.type in ('text', 'text[]') and v.value <> ''
             group by 1, 2, 3
        ),
        ranked as (
            select v.*, row_number() over w as rn, count(*) over (partition by v.doc_type, v.key)
                   as distinct_values
              from vals v
            window w as (partition by v.doc_type, v.key order by v.n desc, v.value)
        ),
        per_key_values as (
            select r.doc_type, r.key, max(r.distinct_values) as distinct_values,
                   jsonb_object_agg(r.value, r.n) filter (where r.rn <= max_values) as "values"
              from ranked r group by 1, 2
        ),
        ranges as (
            select k.doc_type, k.key,
                   min(c.metadata->>k.key) filter (where k.type = 'date') as min_date,
                   max(c.metadata->>k.key) filter (where k.type = 'date') as max_date,
                   min((c.metadata->>k.key)::numeric)
                       filter (where k.type in ('integer', 'numeric')) as min_number,
                   max((c.metadata->>k.key)::numeric)
                       filter (where k.type in ('integer', 'numeric')) as max_number
              from keys k
              join pgrag.chunks c on c.doc_type = k.doc_type
             where k.type in ('date', 'integer', 'numeric')
               and jsonb_typeof(c.metadata->k.key) = case k.type when 'date' then 'string'
                                                              else 'number' end
             group by 1, 2
        ),
        per_key as (
            select k.doc_type, k.key, jsonb_strip_nulls(jsonb_build_object(
                       'type', k.type, 'values', p."values",
                       'distinct_values', p.distinct_values,
                       'min', coalesce(to_jsonb(r.min_date), to_jsonb(r.min_number)),
                       'max', coalesce(to_jsonb(r.max_date), to_jsonb(r.max_number)))) as info
              from keys k
              left join per_key_values p on p.doc_type = k.doc_type and p.key = k.key
              left join ranges r on r.doc_type = k.doc_type and r.key = k.key
        )
        select coalesce(jsonb_object_agg(d.name, jsonb_strip_nulls(jsonb_build_object(
                   'parent_type', d.parent_type,
                   'description', d.vocabulary->'description',
                   'synonyms', d.vocabulary->'synonyms',
                   'has_stats', exists (select from pgrag.doc_stats s where s.doc_type = d.name),
                   'documents', (select count(*) from pgrag.chunks c where c.doc_type = d.name),
                   'keys', coalesce((
                       select jsonb_object_agg(p.key, p.info || jsonb_strip_nulls(
                                  jsonb_build_object(
                                      'description', d.vocabulary->'keys'->p.key->'description',
                                      'synonyms', d.vocabulary->'keys'->p.key->'synonyms',
                                      'value_synonyms', d.vocabulary->'keys'->p.key->'values')))
                         from per_key p where p.doc_type = d.name), '{}')))), '{}')
          from pgrag.doc_types d);
end
$fn$;

comment on function pgrag.vocabulary(integer) is
    'What the question parser knows of each declared type: keys, their types, the values present '
    '(as this session sees the chunks) and the words described with pgrag.describe_document';


-- Sync at commit: render every document a transaction changed once, when it commits.
-- docs/documents.md (Sync) and docs/reliability.md (Deadlocks) explain why.
--
-- A watched table's statement trigger records what its statement changed (pgrag._record): keys
-- in the transaction's memory, rows and many keys in the unlogged pgrag.sync_queue, and the
-- transaction's marker in pgrag.sync_pending, whose constraint trigger is DEFERRABLE INITIALLY
-- DEFERRED: it fires once, at commit, and runs pgrag.sync_now:
--   1. the key queries that read other tables run over the recorded rows (once), unless each
--      statement's trigger ran them over its own rows (a statement of up to 1,000 rows does,
--      pgrag._record_keys_found) and no transaction committed since;
--   2. a transaction that truncated a watched table, or holds an ACCESS EXCLUSIVE lock on one
--      (LOCK TABLE) renders nothing: a render by another transaction may be waiting for that
--      lock while holding a document lock; its documents go to the render queue (the worker
--      renders them once it has committed);
--   3. the documents' locks, all at once, in the one global order (pgrag._lock_documents):
--      renders of different documents never wait for each other;
--   4. if a transaction committed between step 1 (or the statements' own key queries) and now,
--      the key queries over the recorded rows again: it
--      may have moved a row to a document step 1 did not find (its render could not see this
--      transaction's change). Locks of what they add are only tried (they are out of order);
--      what is held elsewhere goes to the render queue. Repeated until nothing committed;
--   5. the renders, parents before children; a document whose render fails is recorded in
--      pgrag.render_errors and skipped, never failing the commit.
-- At commit the transaction takes no new row lock on any source table, and chunk rows are only
-- written under their document's lock, so pgrag adds no deadlock to the application's.
--
-- `set pgrag.sync = immediate` renders at the end of each statement instead (a session that
-- reads its own chunks before committing); `select pgrag.sync_now()` renders what is recorded
-- so far, as does `set constraints pgrag.pgrag_sync_at_commit immediate` (then after every
-- statement).

create or replace function pgrag.sync_now()
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render every document this transaction recorded so far (the commit-time trigger calls it; a
-- session may call it to read its own chunks before committing). Returns the number of chunks
-- written or deleted. The recorded rows are read in bounded batches, never all at once.
declare
    me xid8 := pg_current_xact_id_if_assigned();
    pending text;
    todo jsonb;
    has_rows boolean;  -- sync_queue holds rows this transaction recorded (their key queries)
    has_keys boolean;  -- and keys, or types rendered whole (a large statement, a TRUNCATE)
    exclusive boolean;  -- it holds an ACCESS EXCLUSIVE lock on a table renders read
    entries refcursor;
    before_keys pg_snapshot;
    keyed_at pg_snapshot;  -- the statements' key queries ran after it (NULL: not all ran)
    n bigint;
begin
    if me is null then
        return 0;  -- this transaction wrote nothing, so it recorded nothing
    end if;
    pending := nullif(current_setting('pgrag.pending', true), '');
    if pending is not null then
        perform set_config('pgrag.pending', '', true);
        perform set_config('pgrag.pending_full', '', true);
    end if;
    if coalesce(current_setting('pgrag.keyed_at', true), '') <> '' then
        keyed_at := nullif(current_setting('pgrag.keyed_at', true), 'unkeyed')::pg_snapshot;
        perform set_config('pgrag.keyed_at', '', true);
    end if;
    if keyed_at is not null and pgrag._committed_between(keyed_at, pg_current_snapshot()) then
        keyed_at := null;  -- a row may have moved since: asked again, before the locks (step 1)
    end if;
    if current_setting('pgrag.marked', true) <> '' then
        perform set_config('pgrag.marked', '', true);
        delete from pgrag.sync_pending p where p.xid = me;
    end if;
    -- (what sync_queue holds, read once: each statement of this function costs a commit
    -- 20-40 µs, its plan's start and end included)
    select coalesce(bool_or(s.changed is not null), false),
           coalesce(bool_or(s.changed is null), false)
      into has_rows, has_keys
      from pgrag.sync_queue s where s.xid = me;
    if pending is null and not has_rows and not has_keys then
        return 0;
    end if;

    -- what the statements found: their keys, and every document of a truncated type
    todo := pgrag._todo_of_lines(pending);
    if has_keys then
        select pgrag._todo_merge(todo, coalesce(jsonb_object_agg(
                   x.doc_type, case when x.every then 'null'::jsonb else to_jsonb(x.keys) end),
                   '{}'))
          into todo
          from (select s.doc_type, bool_or(s.keys is null) as every,
                       coalesce(array_agg(distinct k) filter (where k is not null), '{}') as keys
                  from pgrag.sync_queue s left join lateral unnest(s.keys) u(k) on true
                 where s.xid = me and s.changed is null
                 group by s.doc_type) x;
    end if;

    -- 1. the key queries over the recorded rows (of types not rendered whole), unless every
    --    statement ran them already and nothing committed since (keyed_at): step 4 then asks
    --    again if a transaction commits before the locks are taken
    before_keys := coalesce(keyed_at, pg_current_snapshot());
    if has_rows and keyed_at is null then
        open entries for select s.doc_type, s.source_table, s.changed as rows
                           from pgrag.sync_queue s
                          where s.xid = me and s.changed is not null
                          order by s.doc_type, s.source_table, s.seq;
        todo := pgrag._todo_merge(todo, pgrag._keys_of_rows(entries, todo));
    end if;

    -- 2. holding an ACCESS EXCLUSIVE lock on a table renders read (a TRUNCATE, LOCK TABLE):
    --    everything to the worker. (Not for a table this transaction created: no other
    --    transaction can wait for it.)
    --    (Which tables, asked only of a transaction holding any such lock: most hold none,
    --    and a statement that reads the lock table alone starts faster, 10-20 µs a commit.)
    exclusive := current_setting('pgrag.truncated', true) is not distinct from 'on';
    if not exclusive and exists (select from pg_lock_status() l
                                  where l.pid = pg_backend_pid() and l.locktype = 'relation'
                                    and l.mode = 'AccessExclusiveLock' and l.granted) then
        exclusive := exists (select from pg_locks l join pg_class c on c.oid = l.relation
                              where l.pid = pg_backend_pid() and l.locktype = 'relation'
                                and l.mode = 'AccessExclusiveLock' and l.granted
                                and not pgrag._made_here(c.xmin)
                                and (exists (select from pgrag.doc_watches w
                                              where w.source_table = c.oid)
                                     or exists (select from pgrag.doc_types d
                                                 where d.source = c.oid)));
    end if;
    if exclusive then
        perform pgrag._defer(todo);
        insert into pgrag.render_queue (doc_type, source_table, rows)  -- found again after commit
        select s.doc_type, s.source_table, s.changed
          from pgrag.sync_queue s where s.xid = me and s.changed is not null;
        delete from pgrag.sync_queue s where s.xid = me;
        return 0;
    end if;

    -- 3. the locks, in order, waiting as needed
    perform pgrag._lock_documents(todo, true);

    -- 4. what committed meanwhile may have moved rows to other documents
    if has_rows then
        todo := pgrag._moved_meanwhile(todo, before_keys, format(
            'select s.doc_type, s.source_table, s.changed as rows from pgrag.sync_queue s '
            'where s.xid = %L::xid8 and s.changed is not null '
            'order by s.doc_type, s.source_table, s.seq', me));
    end if;
    if has_rows or has_keys then
        delete from pgrag.sync_queue s where s.xid = me;
    end if;

    -- 5. render. Each changed text's full-text vector is written with it, unless the session
    --    asks for it to be left to the worker (pgrag.tsvector = worker: pgrag.index_text fills
    --    it in, searches compute it from the text meanwhile), which takes it off the writer's
    --    commit (0.2 ms of a single-row write of the sample shop) but writes each changed chunk
    --    once more, in the worker: 20-22% fewer writes a second from four writers on two cores
    --    (docs/benchmarks.md, "The tsvector at commit again"). Even then only while a worker
    --    fills them in (it ran pgrag.index_text in the last minute: else nothing would, and
    --    every search would compute them), and for a commit of at most 100 documents: a bulk
    --    one's would cost every search until the worker caught up (33,000 waiting: 1-2 s a
    --    search; found by review)
    n := pgrag._render_todo(todo,
        current_setting('pgrag.tsvector', true) is not distinct from 'worker'
        and (select s.text_indexed_at between clock_timestamp() - interval '1 minute'
                                          and clock_timestamp()
               from pgrag.settings s)
        and (select coalesce(sum(case when jsonb_typeof(e.value) = 'array'
                                      then jsonb_array_length(e.value) end), 0) <= 100
                    and bool_and(jsonb_typeof(e.value) = 'array')
               from jsonb_each(todo) e),
        'record');
    return n;
end
$fn$;

comment on function pgrag.sync_now() is
    'Render the documents this transaction changed (done at commit anyway; call it to read '
    'your own chunks before committing)';


create or replace function pgrag.render_queued(max_entries integer default 100)
returns table (entries integer, documents bigint, oldest interval)
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render up to max_entries entries of pgrag.render_queue (the worker calls it; a cron job or a
-- session may too): their keys, and the documents their rows belong to now (the watches' key
-- queries, on this snapshot, which sees the transactions that recorded them committed), under
-- the documents' locks, parents first. Several callers at once take different entries (SKIP
-- LOCKED); an entry is deleted with the render, in one transaction. Records the lag (queued
-- to rendered) in pgrag.render_lag. Returns the entries taken (0: the queue is empty), the
-- chunks written or deleted, and the oldest entry's age. Rows are read in bounded batches.
declare
    ids bigint[];
    todo jsonb;
    rows_cur refcursor;
    n bigint;
    has_rows boolean;
    before_keys pg_snapshot;
    superuser boolean;
begin
    perform pgrag._check_range('max_entries', max_entries, 1, 100000);
    -- (in a privileged session, only the types it may run: pgrag._may_run_declared; asked
    -- once, not for every entry)
    superuser := pgrag._privileged_session();
    select array_agg(c.id) into ids
      from (select r.id from pgrag.render_queue r
             where not superuser
                or pgrag._may_run_declared((select d.owner from pgrag.doc_types d
                                             where d.name = r.doc_type))
             order by r.id limit max_entries
               for update skip locked) c;
    if ids is null then
        if superuser
           and exists (select from pgrag.render_queue r
                        where not pgrag._may_run_declared((select d.owner from pgrag.doc_types d
                                                            where d.name = r.doc_type))) then
            raise warning using
                message = 'pgrag: the render queue holds documents of types other roles '
                          'declared, which this session does not render (a privileged '
                          'session: it can act as a superuser, with the server''s files or '
                          'programs, or as pgrag''s owner)',
                hint = 'run the worker (or pgrag.render_queued) as a login role that is not '
                       'a superuser, a member of the writer role';
        end if;
        return query select 0, 0::bigint, null::interval;
        return;
    end if;
    select coalesce(jsonb_object_agg(
               x.doc_type, case when x.every then 'null'::jsonb else to_jsonb(x.keys) end), '{}')
      into todo
      from (select s.doc_type, bool_or(s.keys is null and s.rows is null) as every,
                   coalesce(array_agg(distinct k) filter (where k is not null), '{}') as keys
              from pgrag.render_queue s left join lateral unnest(s.keys) u(k) on true
             where s.id = any(ids)
             group by s.doc_type) x;
    has_rows := exists (select from pgrag.render_queue s
                         where s.id = any(ids) and s.rows is not null);
    before_keys := pg_current_snapshot();
    if has_rows then
        open rows_cur for select s.doc_type, s.source_table, s.rows
                            from pgrag.render_queue s
                           where s.id = any(ids) and s.rows is not null
                           order by s.doc_type, s.source_table, s.id;
        todo := pgrag._todo_merge(todo, pgrag._keys_of_rows(rows_cur, todo));
    end if;
    perform pgrag._lock_documents(todo, true);
    -- What committed while the locks were awaited may have moved rows to other documents (a
    -- comment moved onto the task this entry moved, committed by a writer whose render held
    -- a lock this call waited for), as at a writer's commit (pgrag.sync_now). (Without this,
    -- the writer's render and this one each missed the other's change: stale until a rebuild.)
    if has_rows then
        todo := pgrag._moved_meanwhile(todo, before_keys, format(
            'select s.doc_type, s.source_table, s.rows from pgrag.render_queue s '
            'where s.id = any(%L::bigint[]) and s.rows is not null '
            'order by s.doc_type, s.source_table, s.id', ids));
    end if;
    n := pgrag._render_todo(todo, false, 'record');
    insert into pgrag.render_lag (doc_type, documents, lags_ms)
    select s.doc_type,
           case when todo -> s.doc_type = 'null'  -- rendered whole: the type's documents
                then (select count(*)::integer from pgrag.chunks c where c.doc_type = s.doc_type)
                else coalesce(jsonb_array_length(todo -> s.doc_type), 0) end,
           array_agg(extract(epoch from clock_timestamp() - s.queued_at)::real * 1000)
      from pgrag.render_queue s where s.id = any(ids) group by s.doc_type;
    return query select cardinality(ids), n,
                        (select clock_timestamp() - min(s.queued_at)
                           from pgrag.render_queue s where s.id = any(ids));
    delete from pgrag.render_queue s where s.id = any(ids);
    delete from pgrag.render_lag l where l.rendered_at < now() - interval '1 hour';
end
$fn$;

comment on function pgrag.render_queued(integer) is
    'Render documents waiting in pgrag.render_queue (the worker''s first job; any session may)';

