-- Documents, internals: sensitive values cut out at render time, the functions pgrag generates for
-- every declared type, the sync triggers, and the commit-time render of what a transaction
-- changed (docs/documents.md, docs/reliability.md).
--
-- For every declared type pgrag generates, in schema pgrag_docs, as static SQL inside plpgsql
-- with cached generic plans (a document view can take ~8 ms to plan; a session plans it once),
-- with the settings a key's text depends on pinned (pgrag._pin_output_settings):
--   render_<type>(keys)       the source view filtered by keys (pgrag.verify, previews)
--   store_<type>(keys)        the same render, read by itself + upsert + delete + re-link
--                             children + NOTIFY
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


select pgrag._drop_if_changed(to_regprocedure('pgrag._generated_signature(text)'), 'record',
                              'name text, OUT args oidvector, OUT result oid, OUT set_of '
                              'boolean, OUT all_args oid[], OUT modes "char"[]');

create or replace function pgrag._generated_signature(name text, out args oidvector,
                                                      out result oid, out set_of boolean,
                                                      out all_args oid[], out modes "char"[])
language sql immutable parallel safe security invoker
-- The argument and result types (and the arguments' modes) pgrag generates a function of this
-- name with, by its kind, the name's first word (pgrag._generated): render_, store_ and list_
-- (pgrag._create_render_function), keys_ (pgrag._create_sync_function), stats_
-- (pgrag._create_stats_function). The call guard requires exactly these
-- (pgrag._check_generated): the declarer owns its functions, and one it made again taking a
-- domain of its own (whose CHECK runs in the call), or a type of its own with an implicit cast
-- from text[] (or returning one with a cast to bigint), would run the declarer's code as the
-- caller through the conversion (found by an attacker's review, 2026-12-05). No row: not a
-- kind pgrag calls. (A SQL-standard body and no SET clause: its names are bound when it is
-- created, and the guard's query inlines it.)
begin atomic
select x.args, x.result, x.set_of, x.all_args, x.modes
          from (values
              ('render', 'text[]'::regtype::oid::text::oidvector, 'record'::regtype::oid, true,
               array['text[]'::regtype, 'text'::regtype, 'text'::regtype, 'text'::regtype,
                     'jsonb'::regtype, 'text'::regtype]::oid[], '{i,t,t,t,t,t}'::"char"[]),
              ('store', 'text[]'::regtype::oid::text::oidvector, 'bigint'::regtype::oid, false,
               null, null),
              ('list', ''::oidvector, 'text'::regtype::oid, true, null, null),
              ('keys', 'text[]'::regtype::oid::text::oidvector, 'text[]'::regtype::oid, false,
               null, null),
              ('stats', format('%s %s', 'jsonb'::regtype::oid, 'text[]'::regtype::oid)::oidvector,
               'record'::regtype::oid, false,
               array['jsonb'::regtype, 'text[]'::regtype, 'jsonb'::regtype,
                     'boolean'::regtype]::oid[], '{i,i,o,o}'::"char"[])
          ) x(kind, args, result, set_of, all_args, modes)
         where x.kind = split_part(name, '_', 1);
end;

comment on function pgrag._generated_signature(text) is
    'The argument and result types pgrag generates a function of that name with';


create or replace function pgrag._session_roles()
returns oid[]
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The roles this session acts as or can return to: the role that logged in (SET SESSION
-- AUTHORIZATION changes session_user, not it, and code run in the session can RESET back to
-- it), session_user and current_user, each once. (The login from the backend's own status
-- entry: pg_stat_get_activity(pid) builds a row of 30 columns for it, 9 µs against 4; a
-- writer's commit asks this three times. PL/pgSQL: a SQL function's call costs more than
-- its query here.)
begin
    return array(select distinct u.r
                   from unnest(array[(select pg_stat_get_backend_userid(b)
                                        from pg_stat_get_backend_idset() b
                                       where pg_stat_get_backend_pid(b) = pg_backend_pid()),
                                     to_regrole(quote_ident(session_user))::oid,
                                     to_regrole(quote_ident(current_user))::oid]) u(r)
                  where u.r is not null);
end
$fn$;

comment on function pgrag._session_roles() is
    'The roles a session acts as or can return to: its login, session_user, current_user';


create or replace function pgrag._privileged_roles(only_beyond regrole default null)
returns setof regrole
language sql stable security invoker
-- The privileged roles this session can act with (through a role of pgrag._session_roles): a
-- superuser, pg_read_server_files, pg_write_server_files, pg_execute_server_program (the
-- server's files and programs, as its OS account), the owner of schema pgrag (whose functions
-- every session runs: code acting as it could replace them). only_beyond: leave out those that
-- role may act as itself (it gains nothing from them).
-- A SQL-standard body and no SET clause: its names are bound when it is created (no search_path
-- can change what it calls), and the planner inlines it into the query that calls it (a
-- writer's commit asks three times; a SET clause would make every call a function call of its
-- own).
begin atomic
select distinct r.oid::regrole
  from pg_roles r, unnest(pgrag._session_roles()) u(oid)
 where (r.rolsuper
        or r.rolname in ('pg_read_server_files', 'pg_write_server_files',
                         'pg_execute_server_program')
        or r.oid = (select n.nspowner from pg_namespace n where n.nspname = 'pgrag'))
   and pg_has_role(u.oid, r.oid, 'MEMBER')
   and (only_beyond is null or not pg_has_role(only_beyond, r.oid, 'MEMBER'));
end;

comment on function pgrag._privileged_roles(regrole) is
    'The privileged roles (superuser, server files or programs, pgrag''s owner) the session can '
    'act with, beyond those a given role may act as';


create or replace function pgrag._privileged_session()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether the session can act with a privileged role (pgrag._privileged_roles): then code a
-- declarer left behind in it (a search_path set for the session, a deferred trigger, a role
-- reset to the login) would act with that role's rights.
return exists (select from pgrag._privileged_roles());

comment on function pgrag._privileged_session() is
    'Whether the session can act as a superuser, with the server''s files or programs, or as '
    'pgrag''s owner';


create or replace function pgrag._may_run_declared(owner regrole)
returns boolean
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Whether this session may run SQL that role ``owner`` declared (its generated functions, its
-- statistics parsed): not when the session can act with a privileged role (a superuser, the
-- server's files or programs, pgrag's owner: pgrag._privileged_roles) that the owner may not
-- act as itself. The declarer's code runs as itself there, but in that session: what it leaves
-- behind (a search_path, a deferred trigger that fires at commit, a role reset to the
-- session's own) acts with the session's rights, and no check after the call sees all of it.
-- (PL/pgSQL keeps the plan, pgrag._privileged_roles inlined into it.)
begin
    return not exists (select from pgrag._privileged_roles(owner));
end
$fn$;

comment on function pgrag._may_run_declared(regrole) is
    'Whether this session may run a role''s declared SQL (not where it could act with a '
    'privileged role the declarer may not act as)';


drop function if exists pgrag._superuser_session();  -- (now pgrag._privileged_session)


create or replace function pgrag._refuse_declared(owner regrole, what text)
returns void
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- PR008 unless pgrag._may_run_declared(owner): what: the type (or its statistics).
begin
    if not pgrag._may_run_declared(owner) then
        raise exception using errcode = 'PR008',
            message = format('pgrag does not run the SQL role %s declared (%s) in a privileged '
                             'session (one that can act as a superuser, with the server''s files '
                             'or programs, or as pgrag''s owner): the code could act with its '
                             'rights', owner, what),
            hint = format('run this as %s, or as a login role that is not (and may not become) '
                          'a superuser (the worker too: `pgrag worker` as a member of the '
                          'writer role)', owner);
    end if;
end
$fn$;

comment on function pgrag._refuse_declared(regrole, text) is
    'PR008 in a privileged session for SQL another role declared';


create or replace function pgrag._session_state()
returns text
language plpgsql volatile security invoker
-- No SET clause, every name, type and operator qualified: it reads the session as the code
-- before it left it, and no search_path can change what it calls.
as $fn$
-- What a declarer's code running in another role's session could leave behind for that role's
-- later statements (pgrag._check_generated_after; its prepared statements are compared there):
-- the search_path (a non-local set_config outlives the function that sets it, SET clause or
-- not), pgrag's own settings, every one pgrag reads (pgrag.sync 'off' would skip the
-- session's later renders; tests/security/test_escalations.py holds the list to this), the
-- open cursors (a WITH HOLD cursor runs its query at the caller's commit, as the caller: found
-- by review), and the temporary relations and types, each by oid (a temp view named like the
-- caller's table; counted, they let a DISCARD TEMP and as many new objects pass: found by
-- review), read only in a session that has a temporary schema (most have none: it scans
-- pg_class, 35 µs). (PL/pgSQL: without a temporary schema it is two simple expressions,
-- about 3 µs against a SQL function's 16; a writer's commit reads it six times.)
declare
    -- (types qualified too: PL/pgSQL resolves them when it compiles the function, in the
    -- caller's search_path, and a migration's CREATE OR REPLACE makes the next call compile
    -- it again, there a declarer's code may have left a domain named `oid` with a CHECK of its
    -- own: found by review)
    temp_schema pg_catalog.oid := pg_catalog.pg_my_temp_schema();
    settings pg_catalog.text := pg_catalog.concat_ws(E'\n',
        pg_catalog.current_setting('search_path'),
        pg_catalog.current_setting('pgrag.sync', true),
        pg_catalog.current_setting('pgrag.tenant', true),
        pg_catalog.current_setting('pgrag.pending', true),
        pg_catalog.current_setting('pgrag.pending_full', true),
        pg_catalog.current_setting('pgrag.marked', true),
        pg_catalog.current_setting('pgrag.truncated', true),
        pg_catalog.current_setting('pgrag.keyed_at', true),
        pg_catalog.current_setting('pgrag.defer_tsv', true),
        pg_catalog.current_setting('pgrag.tsvector', true),
        -- (and those that shape the session's later searches: a view that left ef_search at
        -- 1000, or the filters' kept estimates forged, slowed or thinned every search after it)
        pg_catalog.current_setting('pgrag.ef_search', true),
        pg_catalog.current_setting('pgrag.filter_estimates', true),
        -- (and the options a migration reads: pgrag/migrate.py sets them for its session)
        pg_catalog.current_setting('pgrag.drop_data', true),
        pg_catalog.current_setting('pgrag.embedding_dim', true),
        pg_catalog.current_setting('pgrag.hnsw_m', true),
        pg_catalog.current_setting('pgrag.hnsw_ef_construction', true),
        pg_catalog.current_setting('pgrag.reader_role', true),
        pg_catalog.current_setting('pgrag.writer_role', true),
        pg_catalog.current_setting('pgrag.tenant_partitions', true),
        temp_schema,
        (select pg_catalog.string_agg(pg_catalog.concat(c.name, '@', c.creation_time, '@',
                                                        c.is_holdable), ',' order by c.name)
           from pg_catalog.pg_cursors c));
begin
    if temp_schema operator(pg_catalog.=) 0 then
        return settings;
    end if;
    return pg_catalog.concat_ws(E'\n', settings,
        (select pg_catalog.string_agg(c.oid::pg_catalog.text, ',' order by c.oid)
           from pg_catalog.pg_class c
          where c.relnamespace operator(pg_catalog.=) temp_schema),
        (select pg_catalog.string_agg(t.oid::pg_catalog.text, ',' order by t.oid)
           from pg_catalog.pg_type t
          where t.typnamespace operator(pg_catalog.=) temp_schema));
end
$fn$;

comment on function pgrag._session_state() is
    'What code run in this session could leave for its later statements (search_path, temp '
    'objects, pgrag settings)';


create or replace function pgrag._prepared_statements()
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The session's prepared statements, each as name@prepare_time (one made again has another
-- time): what pgrag._check_generated records and pgrag._check_generated_after compares.
begin
    return (select coalesce(jsonb_agg(s.name || '@' || s.prepare_time order by s.name), '[]')
              from pg_prepared_statements s);
end
$fn$;

comment on function pgrag._prepared_statements() is
    'The session''s prepared statements (name@prepare_time), to compare before and after a call';


drop function if exists pgrag._generated_version(text);  -- (now for many at once)

create or replace function pgrag._generated_versions(names text[])
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $fn$
-- pgrag_docs.<name> of each name as its catalog row is now ({name: version}): how many functions
-- have that name, and the first one's oid, security definer flag, owner and row version, in
-- that order, joined by ':' (read by position: pgrag._check_own takes the count and the owner,
-- pgrag._check_generated_after the oid). The row version, since an ALTER to SECURITY INVOKER
-- and back, both committed while the function ran, left the other three as they were, and the
-- call went unseen (found by review: 766 of 15,421 calls in a race). Its ctid, not its xmin:
-- every new version of the row takes another place (the old one stays while the caller's
-- snapshot may see it), where a VACUUM freezing the row changes its xmin. A migration
-- regenerating the function while it runs changes it too: that call is refused (PR003,
-- recorded as the document's render error) and the next one runs. A name without a function
-- is left out.
begin
    -- (a lateral query a name, compared as a name: pg_proc's index serves it, where `proname =
    -- any(names)` scanned the catalog; its plan generic: one planned for the array's size at
    -- every call took 130 µs for two names, against 20)
    return (select coalesce(jsonb_object_agg(u.name, v.version)
                                filter (where v.version is not null), '{}')
              from unnest(names) u(name)
              cross join lateral (
                  select count(*)::text || ':' || min(p.oid::text || ':' || p.prosecdef::text
                                                      || ':' || p.proowner::text || ':'
                                                      || p.ctid::text) as version
                    from pg_proc p
                   where p.pronamespace = 'pgrag_docs'::regnamespace
                     and p.proname = u.name::name) v);
end
$fn$;

comment on function pgrag._generated_versions(text[]) is
    'Generated functions'' oid, definer flag, owner and row version, compared around a call';


create or replace function pgrag._session_token()
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The session before pgrag runs a declarer's code in it: pgrag._session_state(), and the
-- prepared statements (pgrag._undo_prepared deallocates those made since).
begin
    return jsonb_build_object('state', pgrag._session_state(),
                              'prepared', pgrag._prepared_statements());
end
$fn$;

comment on function pgrag._session_token() is
    'The session''s state and prepared statements, before a declarer''s code runs in it';


create or replace function pgrag._definer_now(name text, expected oid)
returns boolean
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Whether pgrag_docs.<name>, as a call would find it now, is still the function `expected`
-- and a security definer, read from the catalog cache, which sees every committed change. A
-- query on pg_proc sees the catalog as of the transaction's snapshot: in a REPEATABLE READ or
-- SERIALIZABLE transaction, an ALTER FUNCTION ... SECURITY INVOKER (or a drop and a new
-- function) committed after it began went unseen, and the call ran the declarer's code as the
-- caller (found by review). to_regproc finds the one function of that name (NULL: none, or
-- more than one); pg_get_functiondef prints its options on the line after LANGUAGE (line 4,
-- when the argument list and result hold no line break), and anything else there (a SET, a
-- TRANSFORM line, an aggregate) counts as not a definer: pgrag refuses, it never guesses.
declare
    now_oid oid := to_regproc(format('pgrag_docs.%I', name));
    def text;
    options text;
begin
    if now_oid is distinct from expected
       or coalesce(strpos(pg_get_function_arguments(now_oid), E'\n'), 1) > 0
       or coalesce(strpos(pg_get_function_result(now_oid), E'\n'), 1) > 0 then
        return false;  -- (NULL anywhere here: gone meanwhile, refused as well)
    end if;
    begin
        def := pg_get_functiondef(now_oid);
    exception when others then
        return false;  -- (an aggregate or a procedure has no such definition)
    end;
    if coalesce(split_part(def, E'\n', 3) !~ '^ LANGUAGE [a-z0-9_]+$', true) then
        return false;
    end if;
    options := split_part(def, E'\n', 4);
    return coalesce(options ~ ('^( (WINDOW|IMMUTABLE|STABLE|STRICT|LEAKPROOF|PARALLEL SAFE'
                               '|PARALLEL RESTRICTED|SECURITY DEFINER|COST [0-9.]+|ROWS [0-9.]+))+$')
                    and options ~ ' SECURITY DEFINER( |$)', false);
end
$fn$;

comment on function pgrag._definer_now(text, oid) is
    'Whether a generated function is still the same security definer in the catalog as it is '
    'now (for REPEATABLE READ and SERIALIZABLE transactions, whose snapshot hides changes)';


create or replace function pgrag._check_own(names text[], owners regrole[])
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The call guard of a session that is its declarer's own: NULL unless the session acts as one
-- role only, the declarer (owners[i]) of every pgrag_docs.<names[i]>: the role that logged in,
-- session_user and current_user (pgrag._session_roles) are all that role. The declared code
-- then runs in a session that is its declarer's: whatever it does or leaves behind acts with
-- rights the session has anyway, and pgrag's statements around the calls run as that role
-- too. What is left to guard: each function must be the only one of its name, and the
-- declarer's (another writer's function of that name, made after the declarer's was dropped,
-- would run its code as the declarer: CREATE on pgrag_docs is every writer's); its language,
-- security and types are the declarer's own business (they run as the declarer either way).
-- NULL too when one is not: pgrag._render_todo then stores the types under the full guard
-- (pgrag._check_generated), which names what is wrong. Otherwise returns what
-- pgrag._check_generated_after compares after the calls, with no session state (the
-- declarer's own): the functions' catalog rows (one replaced meanwhile by another's shows
-- there, and the calls are undone) and the prepared statements (deallocated if made since);
-- before each call after the first, the caller compares that function again (another writer
-- could stall the first call and put its function in the place of the next: found by review).
-- An application that declares its documents as the role it writes with (the sample shop's
-- superuser too) pays about 0.1 ms less a commit, 4% (docs/security.md). (A NULL owner is
-- nobody's.)
declare
    me oid := to_regrole(quote_ident(current_user))::oid;
    versions jsonb;
begin
    if me is null or pgrag._session_roles() is distinct from array[me] then
        return null;
    end if;
    -- (the owners asked with the functions, in one statement: each costs a commit 10-20 µs)
    versions := pgrag._generated_versions(names);
    if exists (select from unnest(names, owners) u(name, owner)
                where u.owner::oid is distinct from me
                   or split_part(versions ->> u.name, ':', 1) is distinct from '1'
                   or split_part(versions ->> u.name, ':', 4) is distinct from me::text) then
        return null;
    end if;
    return jsonb_build_object('versions', versions, 'prepared', pgrag._prepared_statements());
end
$fn$;

comment on function pgrag._check_own(text[], regrole[]) is
    'The call guard where the session is its declarer''s own (NULL where it is not)';


drop function if exists pgrag._check_generated(text, regrole);  -- (now for many at once)

create or replace function pgrag._check_generated(names text[], owners regrole[])
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $fn$
-- Before pgrag calls pgrag_docs.<names[i]>, generated functions of types, for a role that may
-- not be their declarer (a trigger's writer, the worker, an admin's refresh, a reader's
-- statistics): each must still be what pgrag created, a security definer owned by its declarer
-- (owners[i]), the only function of that name. Its declarer owns it, so could otherwise turn it
-- into a security invoker (ALTER FUNCTION needs only ownership) or replace its body, and run
-- code with the caller's rights, a superuser's included; or add an overload of the same name
-- that makes pgrag's call ambiguous for everyone. PR003 names what is wrong, a missing function
-- too; PR008 a declarer whose SQL the session may not run (pgrag._refuse_declared).
-- Returns what pgrag._check_generated_after compares once the calls return: what makes each
-- function run as whom, the session's state, its prepared statements. Many at once: a
-- writer's commit renders two or three types, checked together (pgrag._render_todo).
declare
    o record;
    f record;
    g record;  -- (what is wrong, for the message)
begin
    -- (single statements, not loops: a writer's commit runs this; the first wrong one is
    -- enough, and the names and owners for its message are read only then)
    select x.owner, x.name into o
      from (select u.owner, min(u.name) as name
              from unnest(names, owners) u(name, owner) group by u.owner
            offset 0) x  -- (each owner once: not pushed below the grouping, 25 µs a call)
     where not pgrag._may_run_declared(x.owner)
     limit 1;
    if o.owner is not null then
        perform pgrag._refuse_declared(o.owner, 'pgrag_docs.' || o.name);
    end if;
    select u.name, u.owner, p.* into f
      from unnest(names, owners) u(name, owner)
      left join lateral pgrag._generated_signature(u.name) sg on true
      cross join lateral (  -- (as in pgrag._generated_versions)
          select count(*) as n,
                 coalesce(bool_and(p.prosecdef and p.proowner = u.owner), false) as as_generated,
                 coalesce(bool_and(p.prokind = 'f' and p.provariadic = 0
                                   and p.pronargdefaults = 0 and p.proargtypes = sg.args
                                   and p.prorettype = sg.result and p.proretset = sg.set_of
                                   and p.proallargtypes is not distinct from sg.all_args
                                   and p.proargmodes is not distinct from sg.modes),
                          false) as typed,
                 min(p.oid) as fn
            from pg_proc p
           where p.pronamespace = 'pgrag_docs'::regnamespace and p.proname = u.name::name) p
     where p.n <> 1 or not p.as_generated or not p.typed
        or (current_setting('transaction_isolation') <> 'read committed'
            and not pgrag._definer_now(u.name, p.fn))
     limit 1;
    if f.name is not null then
        if f.n = 0 then
            -- (the call would find one made since, in another transaction or after this one's
            -- snapshot, and run it unchecked: found by review)
            raise exception using errcode = 'PR003',
                message = format('pgrag_docs.%I does not exist: pgrag calls only the function '
                                 'it generated', f.name),
                hint = format('declare the type again as %s, which regenerates it', f.owner);
        end if;
        if f.n = 1 and f.as_generated and f.typed then  -- (not the definer it was:
                                                         -- pgrag._definer_now)
            raise exception using errcode = 'PR003',
                message = format('pgrag_docs.%I changed after this %s transaction began: pgrag '
                                 'will not run it there, where it cannot see how', f.name,
                                 upper(current_setting('transaction_isolation'))),
                hint = 'run it in a READ COMMITTED transaction; if the function was altered, '
                       'declare the type again as its owner';
        end if;
        if f.n > 1 or not f.as_generated or not f.typed then
            select count(*) as n, min(p.oid::regprocedure::text) as fn,
                   min(pg_get_function_result(p.oid)) as result,
                   bool_and(p.proowner = f.owner) as owned,
                   string_agg(distinct p.proowner::regrole::text, ', ') as owners
              into g
              from pg_proc p
             where p.pronamespace = 'pgrag_docs'::regnamespace and p.proname = f.name;
            if g.n > 1 then
                raise exception using errcode = 'PR003',
                    message = format('pgrag_docs.%I has %s functions of that name (owned by %s): '
                                     'pgrag calls only the one it generated', f.name, g.n,
                                     g.owners),
                    hint = format('drop the others (their owner or a superuser: \df '
                                  'pgrag_docs.%I lists them), then run pgrag rebuild', f.name);
            end if;
            raise exception using errcode = 'PR003',
                message = format('%s was altered: it %s, so pgrag will not run it for other '
                                 'roles', g.fn,
                                 case when not g.owned
                                      then format('belongs to %s, not to %s', g.owners, f.owner)
                                      when not f.as_generated
                                      then 'runs as its caller (security invoker)'
                                      else format('takes or returns types pgrag does not '
                                                  'generate it with (it returns %s; a '
                                                  'conversion to or from them would run in '
                                                  'the call)', g.result) end),
                hint = format('declare the type again as %s, which regenerates it', f.owner);
        end if;
    end if;
    return pgrag._session_token()
           || jsonb_build_object('versions', pgrag._generated_versions(names));
end
$fn$;

comment on function pgrag._check_generated(text[], regrole[]) is
    'Refuse to call generated functions that are no longer their declarer''s security definers';


create or replace function pgrag._undo_prepared(before jsonb)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Deallocate the prepared statements made (or made again) since pgrag._check_generated: a
-- rollback keeps them, and a declarer's code that failed on purpose after replacing one of the
-- caller's (psycopg's, by name) would have it run as the caller next time. Called after every
-- call of a generated function that failed, and by pgrag._check_generated_after.
declare
    s name;
begin
    if before is null then
        return;
    end if;
    for s in select p.name from pg_prepared_statements p
              where not (before -> 'prepared') ? (p.name || '@' || p.prepare_time) loop
        execute format('deallocate %I', s);
    end loop;
end
$fn$;

comment on function pgrag._undo_prepared(jsonb) is
    'Deallocate the prepared statements a generated function''s call left behind';


drop function if exists pgrag._check_generated_after(text, jsonb, text);  -- (now many)

create or replace function pgrag._check_generated_after(names text[], before jsonb, state text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- state: pgrag._session_state() as the caller sees it now (read there, as an argument: this
-- function's own SET clause hides a search_path the calls left behind); NULL after
-- pgrag._check_own, which records none (a state recorded before and NULL now differ). Call it
-- with variables only: an operator in its arguments would be looked up on a search_path a
-- call may have set.
-- After pgrag called pgrag_docs.<names> (pgrag._check_generated before them): the calls ran
-- declarers' code in this session, so they must have left the session as they found it, and
-- no function may have changed while it ran (an ALTER committed between the check and the
-- call: the check would have passed a function that then ran as the caller). Otherwise PR003:
-- raised, it undoes what the calls did in the transaction (their writes, their settings, their
-- temporary objects; a role they altered); statements they prepared are deallocated here,
-- since a rollback keeps them.
declare
    now_versions jsonb;
    altered text;
begin
    if before is null then  -- (pgrag._check_generated returns no NULL: a call it refused)
        raise exception using errcode = 'PR003',
            message = format('%s ran without pgrag''s check',
                             (select string_agg(format('pgrag_docs.%I', n), ', ')
                                from unnest(names) n));
    end if;
    now_versions := pgrag._generated_versions(names);
    if current_setting('transaction_isolation') <> 'read committed' then
        -- (altered while it ran, as the catalog is now)
        now_versions := now_versions - array(
            select n from unnest(names) n
             where not pgrag._definer_now(n, split_part(before -> 'versions' ->> n, ':', 2)::oid));
    end if;
    if now_versions is distinct from before -> 'versions'
       or state is distinct from before ->> 'state'
       or pgrag._prepared_statements() is distinct from before -> 'prepared' then
        perform pgrag._undo_prepared(before);
        altered := (select string_agg(format('pgrag_docs.%I', n), ', ') from unnest(names) n
                     where now_versions -> n is distinct from before -> 'versions' -> n);
        raise exception using errcode = 'PR003',
            message = case when altered is not null
                           then format('%s was altered while it ran: pgrag undid what it did',
                                       altered)
                           else format('%s changed this session (its search_path, temporary '
                                       'objects, prepared statements or pgrag settings): pgrag '
                                       'undid what it did',
                                       (select string_agg(format('pgrag_docs.%I', n), ', ')
                                          from unnest(names) n)) end,
            hint = 'a declared view, key query or statistics query must not change the '
                   'session it runs in; declare the type again without that';
    end if;
end
$fn$;

comment on function pgrag._check_generated_after(text[], jsonb, text) is
    'Refuse what generated functions did if one changed while it ran or they changed the '
    'session';


create or replace function pgrag._generated_view(source regclass, doc_type text, owner regrole)
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether a type's source is the view pgrag generated from its query (pgrag_docs.doc_<type>,
-- owned by its declarer), the only source pgrag drops with the type: the declarer can write
-- its catalog row, and must not make a superuser's drop_document drop some other view.
return exists (select from pg_class c
                where c.oid = source and c.relkind = 'v'
                  and c.relnamespace = 'pgrag_docs'::regnamespace
                  and c.relname = 'doc_' || doc_type and c.relowner = owner);

comment on function pgrag._generated_view(regclass, text, regrole) is
    'Whether a type''s source is the view pgrag generated for it (which it may drop)';


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
-- reader role: readers), never by PUBLIC. A function of the same name with other arguments
-- (a release that changed them) is dropped first; one of another result is dropped by the
-- generating function (CREATE OR REPLACE cannot change it).
-- A function already as it would be made (the same definition, grants and owner, a security
-- definer: its comment holds the definition's fingerprint) is left as it is: every migration
-- regenerates every type's functions, and a new catalog row under a call running meanwhile
-- makes the call guard refuse it (pgrag._generated_versions compares the row's version).
declare
    s pgrag.settings;
    fn regprocedure;
    old regprocedure;
    pinned text := pgrag._pin_output_settings(ddl);
    fingerprint text;
begin
    perform pgrag._claim_generated(name);
    for old in select p.oid::regprocedure from pg_proc p
                where p.pronamespace = 'pgrag_docs'::regnamespace and p.proname = name
                  and p.oid::regprocedure::text
                      <> format('pgrag_docs.%I(%s)', name,
                                (select coalesce(string_agg(format_type(t::regtype, null),
                                                            ',' order by i), '')
                                   from unnest(string_to_array(nullif(args, ''), ', '))
                                        with ordinality u(t, i))) loop
        execute format('drop function %s', old);
    end loop;
    select * into strict s from pgrag.settings;
    fingerprint := 'pgrag generated ' || md5(concat_ws(E'\n', pinned, readers, s.writer_role,
                                                       s.reader_role));
    fn := to_regprocedure(format('pgrag_docs.%I(%s)', name, args));
    if fn is not null and obj_description(fn, 'pg_proc') = fingerprint
       and exists (select from pg_proc p
                    where p.oid = fn and p.prosecdef
                      and p.proowner = (select r.oid from pg_roles r
                                         where r.rolname = current_user)) then
        return;
    end if;
    execute pinned;
    fn := format('pgrag_docs.%I(%s)', name, args)::regprocedure;
    execute format('revoke all on function %s from public', fn);
    execute format('grant execute on function %s to %s', fn,
                   case when readers then format('%I, %I', s.writer_role, s.reader_role)
                        else quote_ident(s.writer_role) end);
    execute format('comment on function %s is %L', fn, fingerprint);
end
$fn$;


create or replace function pgrag._owned_type(doc_type text, what text)
returns pgrag.doc_types
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- The declared type doc_type, which the current user changes (``what``: "its statistics", "its
-- sync mode", "its words") as the role that declared it: its catalog rows stay that role's
-- (row-level security), so a member of it first runs SET ROLE. PR003 otherwise.
declare
    t pgrag.doc_types;
begin
    select * into t from pgrag.doc_types d where d.name = _owned_type.doc_type;
    if not found then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared', doc_type),
            hint = format('declare it first with pgrag.declare_document, then %s '
                          '(`pgrag documents list` shows the declared types)', what);
    end if;
    if t.owner <> current_user::regrole then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s, not to %s',
                             doc_type, t.owner, current_user),
            hint = format('set %s as %s (SET ROLE %s in SQL; from the CLI or the client, the '
                          'URL option options=-c role=%s, e.g. ?options=-c%%20role%%3D%s)',
                          what, t.owner, t.owner, t.owner, t.owner);
    end if;
    return t;
end
$fn$;

comment on function pgrag._owned_type(text, text) is
    'A declared type the current user changes as the role that declared it (PR003 otherwise)';


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
    one_doc text;
    same_sql text;
    set_sql text;
    conflict_sql text;
    defer_sql text;
    parent_sql text;
    secrets text;
    render_sql text;  -- the source's rows as the render returns them (a WHERE on d may follow)
    keyed_sql text;   -- render_sql of the keys `keys`, for the store
    key_check text;   -- the refusal of keys the cast to the key type changes
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

    -- The render, written once: the render function returns it, and the store reads it itself
    -- (one security definer call a type, not two: 25 µs of a 0.3 ms store, 2026-12-05).
    render_sql := format('select d.source_key::text as key, %s as parent, %s as body, %s as meta, '
                         '%s as tenant from %s d',
                         pk_expr, body_expr, md_expr, tenant_expr, t.source);
    -- Keys are source_key::text. One the cast to the key type changes names no document, unless
    -- the cast is wrong (as `character` for character(3) was): then its document exists, the
    -- render would miss it and the store delete it. Refuse that; the scan by text runs only for
    -- such keys. (One key is compared in an expression, not a query.)
    key_check := format($k$
                if cardinality(keys) = 1 then
                    changed_keys := case when keys[1]::%1$s::text is distinct from keys[1]
                                         then keys end;
                else
                    select array_agg(u.k) into changed_keys
                      from unnest(keys) as u(k) where u.k::%1$s::text is distinct from u.k;
                end if;
                if changed_keys is not null then
                    select d.source_key::text, d.source_key::text::%1$s::text
                      into bad_key, read_back
                      from %2$s d where d.source_key::text = any(changed_keys) limit 1;
                end if;
                if bad_key is not null then
                    raise exception using
                        errcode = 'PR004',
                        message = format('key %%L of %%s reads back as %%L after the cast to its '
                                         'key type %%s: its document would be lost',
                                         bad_key, %3$L, read_back, %4$L),
                        hint = 'did the key column''s type change since the declaration? '
                               'declare the type again to regenerate its functions';
                end if$k$,
        key_type,  -- format_type() of the catalog: a type name, never SQL of doc_types'
        t.source, t.name, key_type);

    perform pgrag._create_generated(pgrag._generated('render', t.name), 'text[]', format($f$
        create or replace function pgrag_docs.%1$I(keys text[])
        returns table (key text, parent text, body text, meta jsonb, tenant text)
        language plpgsql stable security definer rows 10
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        #variable_conflict use_variable
        -- security definer, owned by the role that declared the type: its view runs with that
        -- role's rights, whoever asks; it takes keys only (cast to the key type, never SQL).
        -- (A view column named like a variable, `keys`, is always d.keys here.)
        declare
            changed_keys text[];
            bad_key text;
            read_back text;
        begin
            if keys is null then
                return query %2$s;
            else%3$s;
                return query %2$s where d.source_key = any(keys::%4$s[]);
            end if;
        end
        $body$
        $f$,
        pgrag._generated('render', t.name), render_sql, key_check, key_type));
    -- (offset 0: the body is computed once, where the store reads it twice)
    keyed_sql := format('%s where d.source_key = any(keys::%s[]) offset 0', render_sql, key_type);

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

    -- The store: render (as the declarer), skip what did not change, update the documents that
    -- have a chunk and insert the others, delete what the source no longer yields. An UPDATE,
    -- not INSERT ... ON CONFLICT DO UPDATE, for the documents that exist: an insert computes
    -- the tsvector and the hash before it finds the conflict, and the update computes them
    -- again (measured: 0.34 against 0.23 ms per 900-character document). A changed text's
    -- tsvector is written with it, or left NULL for the worker by a render at the commit of a
    -- writer that asks for it (pgrag.tsvector = worker; pgrag.defer_tsv, set by
    -- pgrag._render_todo; the embedding is cleared either way).
    -- Separate statements for "these keys" and "all" so each has a good cached plan (an `or
    -- keys is null` would make the keyed one scan the whole type). It takes no lock: its
    -- callers hold the documents' locks (pgrag._lock_documents).
    -- What both store statements below say alike (a rendered row's alias in them: %1$s; the
    -- deferral of the tsvector: %2$s): a rendered document the same as its chunk (nothing to
    -- write, unless a render that writes tsvectors finds one missing); the columns an UPDATE of
    -- a changed chunk writes; an insert's ON CONFLICT for a chunk another transaction inserted
    -- meanwhile (%1$s: the store's unique key).
    same_sql := $x$((c.text, c.metadata, c.parent_key, c.parent_id, c.tenant, c.truncated_from)
                    is not distinct from (%1$s.body, %1$s.meta, %1$s.parent, %1$s.parent_id,
                                          %1$s.tenant, %1$s.cut)
                    and (c.tsv is not null or (%2$s) is true))$x$;
    set_sql := $x$text = %1$s.body,
                       metadata = %1$s.meta,
                       parent_key = %1$s.parent,
                       parent_id = %1$s.parent_id,
                       tenant = %1$s.tenant,
                       truncated_from = %1$s.cut,
                       embedding = case when c.text = %1$s.body then c.embedding end,
                       embedding_model = case when c.text = %1$s.body then c.embedding_model end,
                       embedded_at = case when c.text = %1$s.body then c.embedded_at end,
                       tsv = case when c.text = %1$s.body and c.tsv is not null then c.tsv
                                  when %2$s then null
                                  else pgrag.text_tsvector(%1$s.body) end,
                       updated_at = now()$x$;
    conflict_sql := $x$on conflict %1$s do update
                set text = excluded.text,
                    metadata = excluded.metadata,
                    parent_key = excluded.parent_key,
                    parent_id = excluded.parent_id,
                    tenant = excluded.tenant,
                    truncated_from = excluded.truncated_from,
                    embedding = case when c.text = excluded.text then c.embedding end,
                    embedding_model = case when c.text = excluded.text then c.embedding_model end,
                    embedded_at = case when c.text = excluded.text then c.embedded_at end,
                    tsv = case when c.text = excluded.text and c.tsv is not null then c.tsv
                               else excluded.tsv end,
                    updated_at = now()
                where (c.text, c.metadata, c.parent_key, c.parent_id, c.tenant, c.truncated_from)
                      is distinct from (excluded.text, excluded.metadata, excluded.parent_key,
                                        excluded.parent_id, excluded.tenant,
                                        excluded.truncated_from)
                   or (c.tsv is null and excluded.tsv is not null)$x$;
    defer_sql := $d$current_setting('pgrag.defer_tsv', true) = 'on'$d$;
    -- the store's unique key: a partitioned store's holds the tenant too
    -- (sql/migrate/store_shape.sql)
    conflict_sql := format(conflict_sql,
                           case when pgrag._store_partitioned() then '(doc_type, source_key, tenant)'
                                else '(doc_type, source_key)' end);
    parent_sql := case when t.parent_type is null then 'null::bigint'
                       else format('(select p.id from pgrag.chunks p where p.doc_type = %L '
                                   'and p.source_key = r.parent)', t.parent_type) end;

    upsert := format($u$
            with src as materialized (
                select r.key, r.parent, left(r.body, %4$s) as body,
                       case when length(r.body) > %4$s then length(r.body) end as cut,
                       r.meta, r.tenant,
                       %3$s as parent_id
                from (%%s) r  -- (the render: render_sql above, of these keys or all)
            ),
            todo as (  -- unchanged documents are not written at all (no tsvector, no WAL),
                       -- unless a render that writes tsvectors finds one missing
                select s.* from src s
                where not exists (
                    select from pgrag.chunks c
                     where c.doc_type = %2$L and c.source_key = s.key and %7$s)
            ),
            upd as (
                update pgrag.chunks as c
                   set %8$s
                  from todo s
                 where c.doc_type = %2$L and c.source_key = s.key
                returning c.source_key, c.embedding is null as pending, false as inserted
            ),
            ins as (  -- (ON CONFLICT: a chunk another transaction inserted meanwhile)
                insert into pgrag.chunks as c
                       (doc_type, source_key, parent_key, parent_id, text, metadata, tenant,
                        truncated_from, tsv)
                select distinct on (s.key)  -- (a key yielded twice is named below)
                       %2$L, s.key, s.parent, s.parent_id, s.body, s.meta, s.tenant, s.cut,
                       case when %6$s then null else pgrag.text_tsvector(s.body) end
                from todo s
                where not exists (select from upd u where u.source_key = s.key)
                order by s.key
                %5$s
                -- (inserted: also a chunk another transaction inserted meanwhile, which the
                -- conflict updated: its children are linked again, which changes nothing.
                -- Not xmax = 0: a partitioned store returns no system column.)
                returning c.source_key, c.embedding is null as pending, true as inserted
            ),
            up as (select * from upd union all select * from ins)
            %%s
            select (select count(*) from up), (select count(*) from up where pending),
                   (select array_agg(up.source_key) from up where inserted),
                   (select min(s.key) from src s group by s.key having count(*) > 1 limit 1),
                   %%s
            into n_up, n_pending, new_keys, twice, n_gone, n_rendered, rendered
            $u$, null, t.name, parent_sql,  -- (%1$s unused: the render is the first %%s)
            pgrag._limit('document_chars'), conflict_sql,
            -- a render at the commit of a writer that asks for it (pgrag.sync_now, with
            -- pgrag.tsvector = worker) leaves a changed text's full-text vector to the worker
            -- (pgrag.index_text): a good part of the cost of writing the chunk
            defer_sql, format(same_sql, 's', defer_sql), format(set_sql, 's', defer_sql));

    -- One document (a writer's commit renders one a type, most often): the same store in plain
    -- statements, a row read and an UPDATE, an INSERT only for a new document. The statement
    -- above costs 0.13-0.20 ms more for one document (its CTEs, their scans and its two
    -- modifying statements' start-up; 2026-12-05). A render that yields more than one row for
    -- the key goes to the statement above, which stores them or names a key yielded twice.
    one_doc := format($o$
                select x.key, x.parent, x.body, x.cut, x.meta, x.tenant, x.parent_id, x.n
                  into doc
                  from (select r.key, r.parent, left(r.body, %4$s) as body,
                               case when length(r.body) > %4$s then length(r.body) end as cut,
                               r.meta, r.tenant, %3$s as parent_id, count(*) over () as n
                          from (%%s) r) x
                 limit 1;
                if doc.n > 1 then
                    %%s;
                else
                    n_up := 0;
                    n_pending := 0;
                    n_gone := 0;
                    twice := null;
                    n_rendered := coalesce(doc.n, 0);
                    rendered := case when doc.n = 1 then array[doc.key] end;
                end if;
                -- A changed document's chunk is updated at once (one statement, where a read
                -- first and then the UPDATE cost a commit 20-40 µs more); only if that finds no
                -- row to change is it read: the same (nothing to write), or new (inserted
                -- below, ON CONFLICT for one committed meanwhile). A key stored twice (a store
                -- partitioned by tenant), one of them as rendered, is left as it is.
                doc_wrote := false;
                doc_same := false;
                if doc.n = 1 then
                    update pgrag.chunks as c
                       set %8$s
                     where c.doc_type = %2$L and c.source_key = doc.key and not %7$s
                       and not exists (select from pgrag.chunks c
                                        where c.doc_type = %2$L and c.source_key = doc.key
                                          and %7$s)
                    returning c.embedding is null into doc_pending;
                    doc_wrote := found;
                    if not doc_wrote then
                        select coalesce(bool_or(%7$s), false) into doc_same
                          from pgrag.chunks c
                         where c.doc_type = %2$L and c.source_key = doc.key;
                    end if;
                end if;
                if doc.n = 1 and not doc_same and not doc_wrote then
                    -- (new, or gone since it was read: ON CONFLICT, a chunk another
                    -- transaction inserted meanwhile, as in the statement above)
                    insert into pgrag.chunks as c
                           (doc_type, source_key, parent_key, parent_id, text, metadata,
                            tenant, truncated_from, tsv)
                    values (%2$L, doc.key, doc.parent, doc.parent_id, doc.body, doc.meta,
                            doc.tenant, doc.cut,
                            case when %6$s then null else pgrag.text_tsvector(doc.body) end)
                    %5$s
                    returning c.embedding is null into doc_pending;
                    doc_wrote := found;
                    if doc_wrote then
                        new_keys := array[doc.key];
                    end if;
                end if;
                if doc_wrote then
                    n_up := 1;
                    n_pending := case when doc_pending then 1 else 0 end;
                end if$o$, null, t.name, parent_sql,  -- (%1$s unused: the render is the first %%s)
            pgrag._limit('document_chars'), conflict_sql, defer_sql,
            format(same_sql, 'doc', defer_sql), format(set_sql, 'doc', defer_sql));

    perform pgrag._create_generated(pgrag._generated('store', t.name), 'text[]', format($f$
        create or replace function pgrag_docs.%1$I(keys text[])
        returns bigint
        language plpgsql volatile security definer
        set search_path = pg_catalog, pg_temp
        set plan_cache_mode = force_generic_plan
        @pinned_settings@
        as $body$
        #variable_conflict use_variable
        -- security definer, owned by the role that declared the type: render (as that role) and
        -- store the documents of these keys (all when NULL). It takes keys only, and no lock:
        -- the caller holds the documents' locks (pgrag._store's callers). It reads the source
        -- view itself, as render_<type> does. (A view column named like a variable, `keys`,
        -- is always d.keys here.)
        declare
            n_up bigint;
            n_pending bigint;
            n_gone bigint;
            n_linked bigint := 0;
            new_keys text[];
            n_rendered bigint;
            rendered text[];
            twice text;
            doc record;  -- (names no column of the store's statements: see one_doc)
            doc_pending boolean;
            doc_wrote boolean;
            doc_same boolean;
            changed_keys text[];
            bad_key text;
            read_back text;
        begin
            if keys is null then
                %2$s;
            else%6$s;
                if cardinality(keys) = 1 then
                    %5$s;
                else
                    %3$s;
                end if;
            end if;
            if twice is not null then  -- (its chunk would take one of the two, silently)
                raise exception using errcode = 'PR004',
                    message = format('the source of %%s yields source_key %%s more than once',
                                     %4$L, twice),
                    hint = 'a document type''s source must give each source_key one row';
            end if;
            if keys is not null then
                -- the keys the source no longer yields: their chunks go (a statement of its
                -- own, run only when some key did not render)
                if n_rendered < cardinality(keys) then
                    delete from pgrag.chunks c
                     where c.doc_type = %4$L and c.source_key = any(keys)
                       and c.source_key not in (select unnest(rendered));
                    get diagnostics n_gone = row_count;
                end if;
            end if;

            -- Children rendered before their parent existed find it now (the child types as
            -- declared now: a child declared later needs no new function here).
            if new_keys is not null
               and exists (select from pgrag.doc_types c where c.parent_type = %4$L) then
                update pgrag.chunks ch
                   set parent_id = p.id
                  from pgrag.chunks p
                 where p.doc_type = %4$L
                   and p.source_key = any(new_keys)
                   and ch.doc_type in (select c.name from pgrag.doc_types c
                                        where c.parent_type = %4$L)
                   and ch.parent_key = p.source_key
                   and ch.parent_id is distinct from p.id;
                get diagnostics n_linked = row_count;
            end if;

            if n_pending > 0 then
                perform pgrag._notify('pgrag_chunks');
            end if;
            return n_up + n_gone + n_linked;
        end
        $body$
        $f$,
        pgrag._generated('store', t.name),
        -- (the render goes in as an argument, never into a string formatted again: a view or
        -- column name may hold a %)
        format(upsert, render_sql || ' offset 0',
               $g$, gone as (
                   delete from pgrag.chunks c
                   where c.doc_type = $g$ || quote_literal(t.name) || $g$
                     and not exists (select 1 from src s where s.key = c.source_key)
                   returning 1
               )$g$,
               '(select count(*) from gone), null::bigint, null::text[]'),
        format(upsert, keyed_sql, '',
               '0, (select count(*) from src), (select array_agg(s.key) from src s)'),
        t.name,
        format(one_doc, keyed_sql,
               format(upsert, keyed_sql, '', '0, (select count(*) from src), '
                                             '(select array_agg(s.key) from src s)')),
        key_check));
end
$fn$;


create or replace function pgrag._contention(state text)
returns boolean
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The errors a render or a key query keeps for its caller to retry (a deadlock, a
-- serialization failure, a lock timeout), where others are recorded or handed on: one list for
-- every handler (`when others then if pgrag._contention(sqlstate) then raise; end if; ...`).
-- A cancellation or a statement timeout (57014) goes through by itself: `when others` never
-- catches it.
return state in ('40P01', '40001', '55P03');

comment on function pgrag._contention(text) is
    'Whether an error is contention (deadlock, serialization failure, lock timeout): re-raised';


create or replace function pgrag._todo_keys(keys jsonb)
returns text[]
language sql immutable parallel safe security invoker
-- A type's keys in a set of documents ({type: [keys] | null}, pgrag._lock_documents): the JSON
-- array as text[], JSON null (the whole type) as NULL, what pgrag._store takes. (A SQL-standard
-- body and no SET clause: its names are bound when it is created.)
begin atomic
select case when jsonb_typeof(keys) = 'null' then null
            else array(select jsonb_array_elements_text(keys)) end;
end;

comment on function pgrag._todo_keys(jsonb) is
    'A type''s keys in a set of documents, as pgrag._store takes them';


create or replace function pgrag._rendered(doc_type text, keys text[])
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Documents of a type stored (every one when keys is NULL): they have no render error left.
begin
    if exists (select from pgrag.render_errors e where e.doc_type = _rendered.doc_type) then
        delete from pgrag.render_errors e
         where e.doc_type = _rendered.doc_type and (keys is null or e.source_key = any(keys));
    end if;
end
$fn$;

comment on function pgrag._rendered(text, text[]) is
    'Documents of a type stored: their render errors cleared';


create or replace function pgrag._store(doc_type text, keys text[], on_error text default 'record')
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- Render and store documents of a type (every one when keys is NULL), under the caller's
-- document locks. A document whose render fails never fails the rest, nor the transaction
-- (on_error 'record'): the batch is split in halves until the failing documents are alone;
-- each is recorded in pgrag.render_errors and its chunk stays as it was. A document that
-- renders again loses its error. Contention and cancellation (deadlock, serialization
-- failure, lock or statement timeout) keep their SQLSTATE: they are the caller's to retry.
-- on_error 'raise': the first failure is raised (PR004, naming the type and key).
declare
    n bigint;
    fn text;
    checked jsonb;
begin
    if keys is not null and cardinality(keys) = 0 then
        return 0;
    end if;
    begin
        fn := 'store_' || doc_type;
        checked := pgrag._check_generated(
            array[fn], array[(select d.owner from pgrag.doc_types d
                               where d.name = _store.doc_type)]);
        execute format('select pgrag_docs.%I($1::text[])', fn) into n using keys;
        perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
    exception
        when query_canceled or assert_failure then
            -- (which `when others` does not catch: statements a failing call prepared would
            -- outlive it, and run as the caller: found by review)
            perform pgrag._undo_prepared(checked);
            raise;
        when sqlstate 'PR008' then
            perform pgrag._undo_prepared(checked);
            if checked is not null then
                -- raised by the declared code itself, not by pgrag's check: a failed render
                if on_error = 'raise' and keys is null then
                    raise;
                end if;
                n := null;
            elsif keys is null then
                raise;
            else
                -- a privileged session's write or keyed refresh of another role's type: its
                -- documents go to the worker (which must run unprivileged), with the write
                perform pgrag._defer(jsonb_build_object(doc_type, to_jsonb(keys)));
                raise warning using message = format('pgrag: %s', sqlerrm),
                    detail = format('%s document(s) of %s were queued for the worker instead',
                                    cardinality(keys), doc_type);
                return 0;
            end if;
        when others then
            perform pgrag._undo_prepared(checked);
            if pgrag._contention(sqlstate) then
                raise;
            end if;
            if on_error = 'raise' and keys is null then
                raise;
            end if;
            n := null;
    end;
    if n is not null then
        perform pgrag._rendered(doc_type, keys);
        return n;
    end if;
    if keys is null then
        -- every document failed together: one at a time, those of the source and those stored
        keys := array(select k from pgrag.document_keys(doc_type) k
                      union select c.source_key from pgrag.chunks c where c.doc_type = _store.doc_type);
    end if;
    return pgrag._store_halves(doc_type, keys, on_error);
end
$fn$;

comment on function pgrag._store(text, text[], text) is
    'Render and store documents under the caller''s locks; a failing document is recorded in '
    'pgrag.render_errors and skipped';


create or replace function pgrag._store_halves(doc_type text, keys text[], on_error text)
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- pgrag._store after a batch failed: each half in a subtransaction of its own; a failing half
-- is split again, down to the documents that fail alone (about 2 log2(n) subtransactions per
-- failing document).
declare
    n bigint;
    half integer := cardinality(keys) / 2;
    sensitive boolean;
    max_key_bytes constant integer := 2000;  -- (a btree entry holds 2,704 with the doc_type)
    fn text;
    checked jsonb;
begin
    begin
        fn := 'store_' || doc_type;
        checked := pgrag._check_generated(
            array[fn], array[(select d.owner from pgrag.doc_types d
                               where d.name = _store_halves.doc_type)]);
        execute format('select pgrag_docs.%I($1::text[])', fn) into n using keys;
        perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
        perform pgrag._rendered(doc_type, keys);
        return n;
    exception
        when query_canceled or assert_failure then
            -- (which `when others` does not catch: statements a failing call prepared would
            -- outlive it, and run as the caller: found by review)
            perform pgrag._undo_prepared(checked);
            raise;
        when others then
            perform pgrag._undo_prepared(checked);
            if pgrag._contention(sqlstate) then
                raise;
            end if;
            if cardinality(keys) > 1 then
                null;  -- split below
            elsif on_error = 'raise' then
                raise exception using errcode = 'PR004',
                    message = format('pgrag could not render %s document %s: %s', doc_type,
                                     keys[1], sqlerrm),
                    hint = format('fix the document view %s or the data',
                                  (select d.source::text from pgrag.doc_types d
                                    where d.name = _store_halves.doc_type));
            else
                -- an error in a view with sensitive columns may quote a row's value, and
                -- messages end up in logs: its SQLSTATE only
                sensitive := coalesce((select d.sensitive <> '{}' from pgrag.doc_types d
                                        where d.name = _store_halves.doc_type), false);
                -- A key too long for an index entry (about 2,700 bytes: the store's own
                -- index refused it) is recorded shortened, with its length and hash: as it is,
                -- the error's own index would refuse it too, and fail the writer's commit.
                insert into pgrag.render_errors as e (doc_type, source_key, sqlstate, message)
                values (doc_type,
                        case when octet_length(keys[1]) > max_key_bytes
                             then format('%s… (%s bytes, md5 %s)', left(keys[1], 200),
                                         octet_length(keys[1]), md5(keys[1]))
                             else keys[1] end,
                        sqlstate,
                        case when sensitive
                             then format('message withheld: %s has sensitive columns; '
                                         'pgrag.refresh(%L, array[%L], on_error => ''raise'') '
                                         'shows it', doc_type, doc_type, keys[1])
                             when octet_length(keys[1]) > max_key_bytes
                             then format('its source_key is %s bytes, more than an index entry '
                                         'holds: declare a shorter key (an id, or md5 of this '
                                         'one) (%s)', octet_length(keys[1]), left(sqlerrm, 1000))
                             else left(sqlerrm, 2000) end)
                on conflict on constraint render_errors_pkey do update
                set sqlstate = excluded.sqlstate, message = excluded.message, failed_at = now();
                return 0;
            end if;
    end;
    return pgrag._store_halves(doc_type, keys[1:half], on_error)
         + pgrag._store_halves(doc_type, keys[half + 1:], on_error);
end
$fn$;

comment on function pgrag._store_halves(text, text[], text) is
    'Store a failed batch by halves, down to the documents that fail alone (recorded)';


create or replace function pgrag._lock_documents(todo jsonb, wait boolean)
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $fn$
-- Take the locks of the documents in todo ({type: [keys] | null (all)}), in the one global
-- order every transaction uses: by type, then bucket, then key. A render holds its documents'
-- locks until its transaction ends, so two renders of one document take turns and the later
-- one reads the earlier one's commit; renders of different documents never wait for each other.
--   a type      its lock shared (a whole-type render takes it exclusive: it waits for the
--               keyed renders and they for it);
--   a few keys  (up to 32 of a type) the shared lock of each key's bucket (of 256), then the
--               key's own lock;
--   many keys   each bucket exclusive: at most 256 locks for any number of keys (PostgreSQL's
--               lock table holds a few thousand).
-- Lock ids: (hash of 'pgrag document <type>') for the type, (hash of 'pgrag bucket <type>',
-- bucket) for buckets, (type hash, hash of the key) for keys.
-- wait: take each in order, waiting as needed (no cycle: everyone takes them in this order).
-- Else only what is free now, returning what was not ({type: [keys] | null}); callers that
-- may not wait (they hold locks out of this order) hand those documents to the render queue.
-- The locks are listed, in order, by one statement and taken one by one here (a statement
-- that also took them and worked out the documents of those not taken cost a commit 30-50 µs
-- more, where nearly every commit takes all).
declare
    kinds text[];     -- the locks in order: their kind, ids and documents
    ths integer[];
    tbs integer[];
    bs integer[];
    khs integer[];
    types text[];
    ks text[];
    got boolean[] := '{}';  -- (without waiting) whether each was taken
    k_types text[];   -- (without waiting) every key of todo, with its type and bucket
    k_bs integer[];
    k_keys text[];
    missed jsonb;
begin
    with t as (
        select e.key as doc_type,
               hashtext('pgrag document ' || e.key) as th,
               hashtext('pgrag bucket ' || e.key) as tb,
               jsonb_typeof(e.value) = 'null' as every,
               case when jsonb_typeof(e.value) = 'array' then jsonb_array_length(e.value) end as n
          from jsonb_each(todo) e
    ),
    k as (
        select t.doc_type, t.th, t.tb, t.n, u.k, hashtext(u.k) as kh, hashtext(u.k) & 255 as b
          from t, jsonb_array_elements_text(todo -> t.doc_type) u(k)
         where not t.every
    ),
    items as (
        select t.doc_type, t.th, -1 as b, 0 as sub, 0 as kh,
               case when t.every then 'type_x' else 'type_s' end as kind, t.tb, null::text as k
          from t
        union all
        select distinct k.doc_type, k.th, k.b, 0, 0,
               case when k.n > 32 then 'bucket_x' else 'bucket_s' end, k.tb, null::text
          from k
        union all
        select k.doc_type, k.th, k.b, 1, k.kh, 'key', k.tb, k.k
          from k where k.n <= 32
    )
    select array_agg(i.kind), array_agg(i.th), array_agg(i.tb), array_agg(i.b), array_agg(i.kh),
           array_agg(i.doc_type), array_agg(i.k),
           case when not wait then (select array_agg(k.doc_type) from k) end,
           case when not wait then (select array_agg(k.b) from k) end,
           case when not wait then (select array_agg(k.k) from k) end
      into kinds, ths, tbs, bs, khs, types, ks, k_types, k_bs, k_keys
      from (select * from items i order by i.th, i.doc_type, i.b, i.sub, i.kh) i;
    for j in 1 .. coalesce(cardinality(kinds), 0) loop
        if wait then
            case kinds[j]
                when 'type_s' then perform pg_advisory_xact_lock_shared(ths[j]::bigint);
                when 'type_x' then perform pg_advisory_xact_lock(ths[j]::bigint);
                when 'bucket_s' then perform pg_advisory_xact_lock_shared(tbs[j], bs[j]);
                when 'bucket_x' then perform pg_advisory_xact_lock(tbs[j], bs[j]);
                else perform pg_advisory_xact_lock(ths[j], khs[j]);
            end case;
        else
            got[j] := case kinds[j]
                          when 'type_s' then pg_try_advisory_xact_lock_shared(ths[j]::bigint)
                          when 'type_x' then pg_try_advisory_xact_lock(ths[j]::bigint)
                          when 'bucket_s' then pg_try_advisory_xact_lock_shared(tbs[j], bs[j])
                          when 'bucket_x' then pg_try_advisory_xact_lock(tbs[j], bs[j])
                          else pg_try_advisory_xact_lock(ths[j], khs[j]) end;
        end if;
    end loop;
    if wait or false <> all(got) then
        return '{}';
    end if;
    -- the documents a lock not taken covers: a type's, its bucket's keys, or its key
    -- (hashed lists: 20,000 keys behind another's locks of 2,000 took 0.08 s, nested scans
    -- of JSON 1.5 s, found by review)
    with k as (
        select * from unnest(k_types, k_bs, k_keys) as k(doc_type, b, k)
    ),
    lost as (
        select distinct x.doc_type, x.kind, x.b, x.k
          from unnest(types, kinds, bs, ks, got) as x(doc_type, kind, b, k, got)
         where not x.got
    )
    select jsonb_object_agg(m.doc_type, m.keys) into missed
      from (select l.doc_type,
                   case when bool_or(l.kind like 'type%') then 'null'::jsonb
                        else to_jsonb(array(
                            select distinct k.k from k
                             where k.doc_type = l.doc_type
                               and (k.k in (select l2.k from lost l2
                                             where l2.doc_type = l.doc_type and l2.kind = 'key')
                                    or k.b in (select l2.b from lost l2
                                                where l2.doc_type = l.doc_type
                                                  and l2.kind like 'bucket%'))))
                   end as keys
              from lost l group by l.doc_type) m;
    return coalesce(missed, '{}');
end
$fn$;

comment on function pgrag._lock_documents(jsonb, boolean) is
    'Take the locks of documents ({type: [keys] | null}) in the one global order; without '
    'waiting, return those not taken';


create or replace function pgrag._committed_between(a pg_snapshot, b pg_snapshot)
returns boolean
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Whether a transaction with an id (one that wrote) ended between snapshot a and the later b:
-- one running in a and no longer in b, or one begun after a and already ended in b. (The
-- caller's own transaction is in neither list.) plpgsql, like the other helpers of the commit
-- path: a SQL function not inlined plans its body at every call.
begin
    return exists (select from pg_snapshot_xip(a) x where pg_visible_in_snapshot(x, b))
        or pg_snapshot_xmax(b)::text::numeric - pg_snapshot_xmax(a)::text::numeric
           > (select count(*) from pg_snapshot_xip(b) x where x >= pg_snapshot_xmax(a));
end
$fn$;


create or replace function pgrag._made_here(x xid)
returns boolean
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Whether x (a catalog row's xmin, 32 bits) is this transaction or one of its subtransactions:
-- a visible row whose xmin is still in progress can only be ours (another transaction's
-- uncommitted rows are invisible). Ours are at or after our transaction id, which gives the
-- 64-bit id from the 32 bits; an id that is not ours may come out in the future: not ours.
declare
    top numeric := pg_current_xact_id()::text::numeric;
begin
    return pg_xact_status((top + ((x::text::numeric - top % 4294967296) % 4294967296
                                  + 4294967296) % 4294967296)::text::xid8) = 'in progress';
exception when invalid_parameter_value then
    return false;
end
$fn$;


create or replace function pgrag._todo_merge(a jsonb, b jsonb)
returns jsonb
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Two sets of documents ({type: [keys] | null (all)}) as one, each key once.
begin
    if a is null or a = '{}' then
        return coalesce(b, '{}');
    elsif b is null or b = '{}' then
        return a;
    end if;
    -- (the one merge: as the lines of a transaction's pending set, pgrag._todo_of_lines;
    -- jsonb's text holds no newline)
    return pgrag._todo_of_lines(a::text || E'\n' || b::text);
end
$fn$;


create or replace function pgrag._todo_of_lines(lines text)
returns jsonb
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The documents of lines of JSON objects ({type: [keys]}, one a line: pgrag.pending, written
-- by pgrag._record) as one set, each key once: merged once, however many statements wrote.
-- Lines that share no type with each other (a commit's one statement writes one line per
-- type) are joined as they are, with no query: x || y = y || x holds exactly when no type is
-- in both with other keys (a query here cost a commit 20-40 µs). Their keys are each
-- statement's own, already once each (the key queries' array_agg(distinct)).
declare
    merged jsonb := '{}';
    obj jsonb;
    line text;
begin
    foreach line in array coalesce(string_to_array(lines, E'\n'), '{}') loop
        continue when line = '';
        obj := line::jsonb;
        -- (else merged by the query below, which also refuses lines of any other shape: the
        -- setting is the session's to change)
        if (merged || obj) <> (obj || merged) or jsonb_typeof(obj) <> 'object'
           or jsonb_path_exists(obj, 'strict $.* ? (@.type() != "array" && @.type() != "null")')
           or jsonb_path_exists(obj, 'strict $.* ? (@.type() == "array")[*] ? (@.type() != "string")')
        then
            merged := null;
            exit;
        end if;
        merged := merged || obj;
    end loop;
    if merged is not null then
        return merged;
    end if;
    return (select coalesce(jsonb_object_agg(x.doc_type, x.keys), '{}')
              from (select e.key as doc_type,
                           case when bool_or(jsonb_typeof(e.value) = 'null') then 'null'::jsonb
                                else coalesce(jsonb_agg(distinct v order by v)
                                                  filter (where v is not null), '[]') end as keys
                      from string_to_table(lines, E'\n') l(line)
                      cross join lateral jsonb_each(l.line::jsonb) e
                      left join lateral jsonb_array_elements_text(
                          case when jsonb_typeof(e.value) = 'array' then e.value end) v on true
                     where l.line <> ''
                     group by e.key) x);
end
$fn$;

comment on function pgrag._todo_of_lines(text) is
    'Lines of documents ({type: [keys] | null}, one a line) merged into one set';


create or replace function pgrag._moved_meanwhile(todo jsonb, before_keys pg_snapshot,
                                                  rows_query text)
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- After a render took its documents' locks (pgrag.sync_now at a writer's commit,
-- pgrag.render_queued for the worker): if a transaction committed since the key queries ran
-- (before_keys), it may have moved recorded rows to other documents, so the key queries run
-- again over the recorded rows (rows_query: their cursor's statement, as pgrag._keys_of_rows
-- reads it), until they find nothing new. The documents found are locked only if free (they
-- are out of the global lock order); those held elsewhere go to the render queue
-- (pgrag._defer). Returns todo with the documents found.
declare
    after_locks pg_snapshot := pg_current_snapshot();
    entries refcursor;
    found_keys jsonb;
    missed jsonb;
begin
    while pgrag._committed_between(before_keys, after_locks) loop
        open entries for execute rows_query;
        found_keys := pgrag._todo_minus(pgrag._keys_of_rows(entries, todo), todo);
        exit when found_keys = '{}';
        missed := pgrag._lock_documents(found_keys, false);
        perform pgrag._defer(missed);
        todo := pgrag._todo_merge(todo, pgrag._todo_minus(found_keys, missed));
        before_keys := after_locks;
        after_locks := pg_current_snapshot();
    end loop;
    return todo;
end
$fn$;

comment on function pgrag._moved_meanwhile(jsonb, pg_snapshot, text) is
    'The key queries again after a render''s locks, for what committed meanwhile';


create or replace function pgrag._todo_minus(a jsonb, b jsonb)
returns jsonb
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The documents of a that are not in b (a type b renders whole has none left).
begin
    return (select coalesce(jsonb_object_agg(x.doc_type, x.keys), '{}')
              from (select e.key as doc_type,
                           case when jsonb_typeof(e.value) = 'null' then 'null'::jsonb
                                else to_jsonb(array(select jsonb_array_elements_text(e.value)
                                                    except
                                                    select jsonb_array_elements_text(b -> e.key)))
                           end as keys
                      from jsonb_each(coalesce(a, '{}')) e
                     where jsonb_typeof(b -> e.key) is distinct from 'null') x
             where x.keys <> '[]');
end
$fn$;


create or replace function pgrag._keys_failed(doc_type text, source_table regclass, cause text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- A watch's key query failed, or its generated function is missing: which documents the
-- change touched is unknown. Never the write's failure, never a silent skip: every document of
-- the type goes to the worker (pgrag.render_queue, with the caller's transaction), and a
-- WARNING (in the writer's session and the server log) names the cause and the fix. What
-- causes it: a table the key query names was renamed or dropped (key queries are text), or a
-- watched table was renamed (its generated functions carry its name) since the declaration.
-- A type with sensitive columns gets no message: it may quote a value.
begin
    raise warning using
        message = format('pgrag: the key query of document type %s for table %s failed: %s; '
                         'every %s document is queued for the worker',
                         doc_type, source_table,
                         case when exists (select from pgrag.doc_types d
                                            where d.name = doc_type and d.sensitive <> '{}')
                              then 'message withheld (the type has sensitive columns)'
                              else cause end,
                         doc_type),
        hint = format('after renaming or dropping a table the declaration names, declare %s '
                      'again (pgrag.declare_document) with the tables'' current names; after '
                      'renaming a watched table, `pgrag db upgrade` regenerates its functions',
                      doc_type);
    perform pgrag._defer(jsonb_build_object(doc_type, null));
end
$fn$;

comment on function pgrag._keys_failed(text, regclass, text) is
    'A watch''s key query failed: every document of the type to the worker, and a warning';


create or replace function pgrag._keys_of_rows(entries refcursor, skip jsonb default '{}')
returns jsonb
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The watches' key queries over recorded rows. entries: an open cursor over (doc_type,
-- source_table, rows), ordered by doc_type and source_table; rows is an entry, an array of the
-- table's rows as text (up to 1,000 rows). Returns {type: [keys]}; types whose value in skip
-- is null (rendered whole) are passed over. Entries are read one at a time and handed to
-- pgrag_docs.keys_<type>_<hash> (run as the type's declarer) in batches of at most 16 MB of
-- text: one call for many small entries, bounded memory for many large ones (a statement of
-- a million wide rows records gigabytes). A type's keys are gathered in an array and merged
-- into the result once, when its entries end: merged batch by batch, the result was sorted
-- again at every batch, and a statement of 200,000 rows spent 46 of its 64 s there (a million
-- had not finished after 45 minutes). A key query that fails, or a watch whose function is
-- missing, hands the type's every document to the worker (pgrag._keys_failed), never the
-- caller's failure and never a silent skip.
declare
    r record;
    fn text;
    keys text[];
    one_key text;
    type_keys text[];  -- the keys found for cur_type so far (NULL: none asked yet)
    batch text[] := '{}';
    batch_chars bigint := 0;
    cur_type text;
    cur_table regclass;
    result jsonb := '{}';
    got boolean;
    flush boolean;
    failure text;
    failed text[] := '{}';  -- types whose key query failed: queued whole (pgrag._keys_failed)
    checked jsonb;
begin
    loop
        fetch entries into r;
        got := found;
        flush := cardinality(batch) > 0 and not got;
        if got and cardinality(batch) > 0 then
            flush := r.doc_type is distinct from cur_type
                     or r.source_table is distinct from cur_table
                     or batch_chars + coalesce(length(r.rows), 0) > 16000000;
        end if;
        if flush then
            -- (pgrag._generated's name, inline: this runs at every commit that recorded rows)
            select format('keys_%s_%s', cur_type, left(md5(n.nspname || '.' || c.relname), 10))
              into fn
              from pg_class c join pg_namespace n on n.oid = c.relnamespace
             where c.oid = cur_table;
            failure := null;
            if cur_type = any(failed) then
                null;  -- its documents are queued whole already
            elsif fn is null or to_regprocedure(format('pgrag_docs.%I(text[])', fn)) is null then
                -- a watch still declared whose function is gone (the table was renamed: the
                -- name carries its old name); a watch dropped since: nothing to do
                if exists (select from pgrag.doc_watches w
                            where w.doc_type = cur_type and w.source_table = cur_table) then
                    failure := format('its function pgrag_docs.%s is missing',
                                      coalesce(fn, 'keys_' || cur_type || '_*'));
                end if;
            else
                checked := null;  -- (not an earlier batch's, if the check below fails)
                begin
                    checked := pgrag._check_generated(
                        array[fn], array[(select d.owner from pgrag.doc_types d
                                           where d.name = cur_type)]);
                    execute format('select pgrag_docs.%I($1)', fn) into keys using batch;
                    perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
                exception
                    when query_canceled or assert_failure then
                        perform pgrag._undo_prepared(checked);  -- (as in pgrag._store)
                        raise;
                    when others then
                        perform pgrag._undo_prepared(checked);
                        if pgrag._contention(sqlstate) then
                            raise;
                        end if;
                        failure := sqlerrm;
                end;
                if failure is null then
                    type_keys := coalesce(type_keys, '{}');
                    -- one element at a time: PL/pgSQL appends a single element to the variable
                    -- in place, where `type_keys || keys` would copy all the keys so far at
                    -- each batch
                    foreach one_key in array coalesce(keys, '{}') loop
                        type_keys := type_keys || one_key;
                    end loop;
                end if;
            end if;
            if failure is not null then
                perform pgrag._keys_failed(cur_type, cur_table, failure);
                failed := failed || cur_type;
            end if;
            batch := '{}';
            batch_chars := 0;
        end if;
        if type_keys is not null and (not got or r.doc_type is distinct from cur_type) then
            result := pgrag._todo_merge(result, jsonb_build_object(
                         cur_type, to_jsonb(array(select distinct k from unnest(type_keys) k
                                                   order by k))));
            type_keys := null;
        end if;
        exit when not got;
        continue when r.rows is null or jsonb_typeof(skip -> r.doc_type) = 'null';
        cur_type := r.doc_type;
        cur_table := r.source_table;
        batch := batch || r.rows;
        batch_chars := batch_chars + length(r.rows);
    end loop;
    close entries;
    return result;
end
$fn$;

comment on function pgrag._keys_of_rows(refcursor, jsonb) is
    'The watches'' key queries over recorded rows, read from a cursor in bounded batches';


create or replace function pgrag._render_todo(todo jsonb, defer_tsv boolean, on_error text)
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Store the documents of todo ({type: [keys] | null}) of types still declared, parents before
-- children (a child's parent_id resolves to its parent's new chunk), under the caller's
-- document locks: every render goes through here (a commit's, the worker's, a refresh).
-- Returns the number of chunks written or deleted. defer_tsv: each changed text's tsvector is
-- left NULL for the worker (pgrag.sync_now's small renders, asked to by pgrag.tsvector), else
-- written with it (the setting pgrag.defer_tsv, which the generated store functions read, set
-- either way: a session's own value of it changes nothing). on_error: pgrag._store's.
-- Several types are first stored together (in a READ COMMITTED transaction), under one call
-- guard and in one subtransaction: a writer's commit renders two or three types, and the
-- guard and the subtransaction of each cost more than a small document's render (2026-12-05:
-- 0.12 ms of a 2.6 ms write). If anything fails there, it is all undone, and each type is
-- stored again by itself (pgrag._store), which records, defers or raises as it does for one.
-- Between two calls, each function must still be the one checked (an earlier type's code,
-- run as its declarer, could alter the next if it declared both) and the search_path as it
-- was (pgrag's statements between the calls would otherwise look up names where that code
-- left it: the rest of the session is compared once, after the last call). In a session that
-- is the declarer's of every type alone, one type too goes this way, under the lighter guard
-- of pgrag._check_own: the functions must be the declarer's, and nothing else needs guarding
-- there (docs/security.md).
declare
    n bigint := 0;
    m bigint;
    prior text := current_setting('pgrag.defer_tsv', true);
    types text[];
    keys jsonb[];  -- (each a JSON array of keys, or JSON null: the whole type)
    fns text[];
    owners regrole[];
    checked jsonb;
    path text;
    state text;
    alone boolean := false;
    together boolean := false;
    read_committed boolean := current_setting('transaction_isolation') = 'read committed';
begin
    perform set_config('pgrag.defer_tsv', case when defer_tsv then 'on' else 'off' end, true);
    with recursive chain(name, depth) as (
        select d.name, 0 from pgrag.doc_types d where d.parent_type is null
        union all
        select d.name, c.depth + 1
          from pgrag.doc_types d join chain c on d.parent_type = c.name
         where c.depth < 64)
    -- (the rows sorted once, read in that order by all four aggregates: four sorts cost a
    -- commit 12 µs more)
    select array_agg(x.doc_type), array_agg(x.value), array_agg(x.owner),
           array_agg('store_' || x.doc_type)
      into types, keys, owners, fns
      from (select e.key as doc_type, e.value, d.owner
              from jsonb_each(todo) e join pgrag.doc_types d on d.name = e.key
             where e.value <> '[]'
             order by (select max(c.depth) from chain c where c.name = e.key) nulls last,
                      e.key) x;
    if cardinality(types) > 0 and read_committed
       and session_user = current_user then  -- (else not alone: asked for nothing)
        -- (the declarer's own session and functions: nothing else to guard)
        checked := pgrag._check_own(fns, owners);
        alone := checked is not null;
    end if;
    if (cardinality(types) > 1 or alone) and read_committed then
        begin
            if not alone then
                checked := pgrag._check_generated(fns, owners);
                path := current_setting('search_path');
            end if;
            for i in 1 .. cardinality(types) loop
                -- (in the declarer's own session too: another writer, stalling the first
                -- call on a chunk row it locks, could put its own function in the place of a
                -- later one the declarer dropped meanwhile, and have it run as the declarer;
                -- the check after the calls would undo its writes, not a sequence's value it
                -- set: found by review, 2026-12-05)
                if i > 1 and pgrag._generated_versions(array[fns[i]]) -> fns[i]
                             is distinct from checked -> 'versions' -> fns[i] then
                    raise exception 'altered since the check';  -- (named by pgrag._store below)
                end if;
                execute format('select pgrag_docs.%I($1::text[])', fns[i]) into m
                  using pgrag._todo_keys(keys[i]);
                if not alone
                   and not pg_catalog.texteq(pg_catalog.current_setting('search_path'), path) then
                    raise exception 'search_path changed';  -- (named by pgrag._store below)
                end if;
                if m is null then  -- (not a count: pgrag._store treats it as a failed render)
                    raise exception 'no count';
                end if;
                n := n + m;
            end loop;
            if not alone then
                state := pgrag._session_state();
            end if;
            perform pgrag._check_generated_after(fns, checked, state);
            together := true;
        exception
            when query_canceled or assert_failure then  -- (as in pgrag._store)
                perform pgrag._undo_prepared(checked);
                raise;
            when others then
                perform pgrag._undo_prepared(checked);
                if pgrag._contention(sqlstate) then
                    raise;
                end if;
                n := 0;  -- (undone: each type again, by itself, below)
        end;
    end if;
    if together then
        -- (render errors of these types asked once, not a type at a time: there are none,
        -- most often)
        if exists (select from pgrag.render_errors e where e.doc_type = any(types)) then
            for i in 1 .. cardinality(types) loop
                perform pgrag._rendered(types[i], pgrag._todo_keys(keys[i]));
            end loop;
        end if;
    else
        for i in 1 .. coalesce(cardinality(types), 0) loop
            n := n + pgrag._store(types[i], pgrag._todo_keys(keys[i]), on_error);
        end loop;
    end if;
    perform set_config('pgrag.defer_tsv', coalesce(prior, ''), true);
    return n;
end
$fn$;


create or replace function pgrag._notify(channel text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Wake the workers (LISTEN pgrag_render, pgrag_chunks) when this transaction commits, unless a
-- transaction committing at the same time already will. A transaction that notifies takes a
-- lock on the notification queue from its commit's start to its end, so every writer
-- notifying would commit one at a time; this one notifies only if it gets a transaction lock
-- no other holds. The workers, once woken, look again shortly after each batch
-- (pgrag/worker.py), so those that did not notify are seen too.
begin
    if pg_try_advisory_xact_lock(hashtext('pgrag notify ' || channel)::bigint) then
        perform pg_notify(channel, '');
    end if;
end
$fn$;


create or replace function pgrag._defer(todo jsonb)
returns void
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
-- Hand documents ({type: [keys] | null}) to the worker: pgrag.render_queue, committed with the
-- caller's transaction.
begin atomic
    insert into pgrag.render_queue (doc_type, keys)
    select e.key, case when jsonb_typeof(e.value) = 'null' then null
                       else array(select jsonb_array_elements_text(e.value)) end
      from jsonb_each(todo) e
     where jsonb_typeof(e.value) = 'null' or jsonb_array_length(e.value) > 0;
    select pgrag._notify('pgrag_render');
end;


create or replace function pgrag._record(doc_type text, keys text[], source_table regclass,
                                         changed_rows text, op text, queue boolean)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- What a watched table's statement trigger hands on: the keys its statement changed; or, for a
-- key query that reads other tables, the changed rows (their keys are found at commit, or by
-- the worker, on a fresh snapshot); or neither: every document of the type (TRUNCATE).
-- queue: into pgrag.render_queue, committed with the transaction, for the worker. Else into
-- this transaction's pending set, rendered at its commit (pgrag.sync_now): a few keys in the
-- transaction's memory (the setting pgrag.pending: one JSON object a statement, a line each,
-- merged once at commit by pgrag._todo_of_lines; merged at every statement, each of a
-- transaction's 4,000 single-row updates cost 2.5 ms, against 0.7 ms for the first 1,000),
-- rows and many keys in the unlogged
-- pgrag.sync_queue; and the transaction's marker, whose deferred trigger runs pgrag.sync_now.
declare
    pending text;
    small boolean;  -- this statement's keys go to the setting pgrag.pending
begin
    if queue then
        insert into pgrag.render_queue (doc_type, keys, source_table, rows)
        values (doc_type, keys, case when changed_rows is not null then source_table end,
                changed_rows);
        perform pgrag._notify('pgrag_render');
        return;
    end if;
    if op = 'TRUNCATE' then  -- it holds an ACCESS EXCLUSIVE lock: pgrag.sync_now defers
        perform set_config('pgrag.truncated', 'on', true);
    end if;
    pending := current_setting('pgrag.pending', true);
    small := changed_rows is null and keys is not null and cardinality(keys) <= 1000
             and current_setting('pgrag.pending_full', true) is distinct from 'on';
    if small and octet_length(pending) >= 32000 then
        -- Full: merged into one line (documents written again take no room). Copying the
        -- setting costs each statement in proportion to its length, so it stays under 32 KB:
        -- if the merged set is still over 16 KB, the keys of later statements go to
        -- sync_queue (pgrag.pending_full), else they are appended again.
        pending := pgrag._todo_of_lines(pending)::text;
        perform set_config('pgrag.pending', pending, true);
        if octet_length(pending) >= 16000 then
            perform set_config('pgrag.pending_full', 'on', true);
            small := false;
        end if;
    end if;
    if small then
        perform set_config('pgrag.pending',
                           concat_ws(E'\n', nullif(pending, ''),
                                     jsonb_build_object(doc_type, to_jsonb(keys))::text),
                           true);
    else
        insert into pgrag.sync_queue (doc_type, source_table, op, keys, changed)
        values (doc_type, source_table, op, keys, changed_rows);
    end if;
    -- (the setting first: with the constraint set IMMEDIATE, the insert runs pgrag.sync_now at
    -- once, which clears it, so that the next statement inserts the marker again)
    if current_setting('pgrag.marked', true) is distinct from pg_current_xact_id()::text then
        perform set_config('pgrag.marked', pg_current_xact_id()::text, true);
        insert into pgrag.sync_pending default values on conflict do nothing;
    end if;
end
$fn$;

comment on function pgrag._record(text, text[], regclass, text, text, boolean) is
    'Record the documents a statement changed: for its commit, or for the worker (queue)';


create or replace function pgrag._record_keys_found(doc_type text, keys text[],
                                                    source_table regclass, op text,
                                                    taken_after pg_snapshot)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- For a commit: the keys a statement's trigger found for rows it recorded (a key query that
-- reads other tables, run over the statement's transition rows after snapshot taken_after;
-- NULL: it did not run, or failed). The earliest such snapshot of the transaction is kept in
-- the setting pgrag.keyed_at, or 'unkeyed' once one statement's keys were not found (for
-- good: a later statement's snapshot does not make up for it). pgrag.sync_now then asks the
-- key queries over the recorded rows only if a statement's keys are missing, or a transaction
-- committed after that snapshot (it may have moved a recorded row to another document;
-- pgrag._moved_meanwhile).
begin
    if taken_after is null then
        perform set_config('pgrag.keyed_at', 'unkeyed', true);
    elsif coalesce(current_setting('pgrag.keyed_at', true), '') = '' then
        perform set_config('pgrag.keyed_at', taken_after::text, true);
    end if;
    if taken_after is not null and cardinality(keys) > 0 then
        perform pgrag._record(doc_type, keys, source_table, null, op, false);
    end if;
end
$fn$;

comment on function pgrag._record_keys_found(text, text[], regclass, text, pg_snapshot) is
    'Record the keys a statement found for the rows it recorded, and the snapshot they were '
    'found after (pgrag.sync_now asks again only if a transaction committed since)';


create or replace function pgrag._create_sync_function(doc_type text, source_table regclass)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create the trigger function of one watched table, pgrag_docs.sync_<type>_<hash>(), and
-- its key query over queued rows, pgrag_docs.keys_<type>_<hash>(rows), as the role that
-- declared the type (the current user; security definer functions it owns: the key query runs
-- with its rights, whoever writes the table). Per statement, the trigger function records
-- (pgrag._record) what its statement changed:
--   * a key query over `changed` alone (doc_watches.reads empty): it runs once, here, over the
--     statement's transition rows, and the keys are recorded;
--   * a key query that reads other tables: the changed rows are recorded (1,000 per entry),
--     and the key query runs over them when they are rendered, on a snapshot that sees what
--     other transactions committed meanwhile (a row moved to another document);
--   * TRUNCATE: every document of the type.
-- The type's sync mode (doc_types.sync) is written into the function; the session setting
-- pgrag.sync overrides it: commit, queue, immediate (render at the end of each statement),
-- off (record nothing: bulk loads, then pgrag.refresh). Nothing here plans or runs the key
-- query: a declaration checks it as its declarer; a migration regenerating it only creates
-- functions.
declare
    kq text;
    reads regclass[];
    mode text;
    owner regrole;
    keys_sql text := E'select array_agg(distinct q.k::text) into keys from (%s\n) as q(k) where q.k is not null';
    found text;
    body text;
begin
    select w.key_query, w.reads, d.owner, d.sync into strict kq, reads, owner, mode
      from pgrag.doc_watches w join pgrag.doc_types d on d.name = w.doc_type
     where w.doc_type = _create_sync_function.doc_type
       and w.source_table = _create_sync_function.source_table;
    if owner <> current_user::regrole then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s; %s may not generate its '
                             'functions', doc_type, owner, current_user),
            hint = format('act as %s (SET ROLE %s), or declare the type again', owner, owner);
    end if;
    -- Bodies go in as quoted literals (%L), never between dollar quotes: a key query that
    -- contains `$body$` cannot end the body early and add code of its own.
    perform pgrag._create_generated(pgrag._generated('keys', doc_type, source_table), 'text[]',
        format($f$
            create or replace function pgrag_docs.%1$I(changed_rows text[])
            returns text[]
            language plpgsql volatile security definer
            set search_path = pg_catalog, pg_temp
            @pinned_settings@
            as %2$L
            $f$,
            pgrag._generated('keys', doc_type, source_table),
            format($body$
            #variable_conflict use_column
            -- security definer, owned by the role that declared the type: its key query over
            -- recorded rows (entries, each an array of this table's rows as text), as that role.
            -- (A column named like a variable, `keys`, is the column in the key query.)
            declare
                keys text[];
            begin
                with changed as (select r.* from unnest(changed_rows) e(x),
                                                 unnest(e.x::%1$s[]) r) %2$s;
                return keys;
            end
            $body$, source_table, format(keys_sql, kq))));
    -- The key query over the statement's transition rows (`changed`), into keys: it runs here
    -- for a key query over `changed` alone, and for one that reads other tables too when the
    -- statement's rows fit one entry (below).
    found := format($k$
                if tg_op = 'INSERT' then
                    with changed as (select * from pgrag_new) %1$s;
                elsif tg_op = 'UPDATE' then
                    with changed as (select * from pgrag_new union all select * from pgrag_old) %1$s;
                else
                    with changed as (select * from pgrag_old) %1$s;
                end if;$k$, format(keys_sql, kq));
    if reads is not null and cardinality(reads) = 0 then
        -- (a key query that fails, as one naming a table renamed since, never fails the
        -- write: pgrag._keys_failed queues the type whole and warns)
        body := format($b$
            begin%1$s
            exception
                when others then
                    if pgrag._contention(sqlstate) then
                        raise;
                    end if;
                    perform pgrag._keys_failed(%2$L, tg_relid, sqlerrm);
                    keys := null;
            end;
            if cardinality(keys) > 0 then
                perform pgrag._record(%2$L, keys, tg_relid, null, tg_op, queue);
            end if;$b$, found, doc_type);
    else
        -- The rows are recorded (1,000 to an entry) for the key query to run on a snapshot that
        -- sees what other transactions committed meanwhile: at commit, or in the worker. For a
        -- commit, a statement of one entry (most are) also runs it here, with the snapshot it
        -- was taken after (pgrag._record_keys_found): if no transaction commits before the
        -- commit's document locks, the commit asks nothing again (pgrag.sync_now); here it
        -- needs no call guard and no rows parsed back from text.
        body := format($b$
            if tg_op = 'INSERT' then
                perform pgrag._record(%1$L, null, tg_relid, b.rows, tg_op, queue)
                   from (select array_agg(x.r)::text as rows
                           from (select row(pgrag_r.*) as r,
                                        (row_number() over () - 1) / 1000 as g
                                   from pgrag_new pgrag_r) x group by x.g) b;
            elsif tg_op = 'UPDATE' then
                perform pgrag._record(%1$L, null, tg_relid, b.rows, tg_op, queue)
                   from (select array_agg(x.r)::text as rows
                           from (select row(pgrag_r.*) as r,
                                        (row_number() over () - 1) / 1000 as g
                                   from (select * from pgrag_new union all
                                         select * from pgrag_old) pgrag_r) x group by x.g) b;
            else
                perform pgrag._record(%1$L, null, tg_relid, b.rows, tg_op, queue)
                   from (select array_agg(x.r)::text as rows
                           from (select row(pgrag_r.*) as r,
                                        (row_number() over () - 1) / 1000 as g
                                   from pgrag_old pgrag_r) x group by x.g) b;
            end if;
            get diagnostics entries = row_count;
            if not queue and entries > 0 then
                taken_after := case when entries = 1 then pg_current_snapshot() end;
                if taken_after is not null then
                    begin%2$s
                    exception
                        when others then
                            if pgrag._contention(sqlstate) then
                                raise;
                            end if;
                            taken_after := null;  -- asked again at commit, which says why
                    end;
                end if;
                perform pgrag._record_keys_found(%1$L, keys, tg_relid, tg_op, taken_after);
            end if;$b$, doc_type, found);
    end if;
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
        #variable_conflict use_column
        -- security definer, owned by the role that declared the type: the key query runs as
        -- that role, whoever writes the table. (A column of the key query named like a
        -- variable, `mode`, `queue`, `keys`, `entries` or `taken_after`, is the column there;
        -- pgrag's own statements name no table column.)
        declare
            mode text := coalesce(nullif(current_setting('pgrag.sync', true), ''), %1$L);
            queue boolean := mode = 'queue';
            keys text[];
            entries bigint;
            taken_after pg_snapshot;
        begin
            if mode = 'off' then
                return null;
            end if;
            if tg_op = 'TRUNCATE' then
                perform pgrag._record(%2$L, null, tg_relid, null, tg_op, queue);
            else%3$s
            end if;
            if mode = 'immediate' then
                perform pgrag.sync_now();
            end if;
            return null;
        end
        $body$, mode, doc_type, body)));
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
-- Only what exists is dropped: `drop ... if exists` of what does not printed a NOTICE each,
-- six before a failing declaration's own error.
declare
    suffix text;
    f regprocedure;
begin
    if exists (select 1 from pg_class where oid = source_table) then
        foreach suffix in array array['ins', 'upd', 'del', 'trn'] loop
            if exists (select from pg_trigger g
                        where g.tgrelid = source_table
                          and g.tgname = format('pgrag_%s_%s', doc_type, suffix)) then
                execute format('drop trigger %I on %s',
                               format('pgrag_%s_%s', doc_type, suffix), source_table);
            end if;
        end loop;
        for f in select x from (values
                     (to_regprocedure(format('pgrag_docs.%I()',
                                             pgrag._generated('sync', doc_type, source_table)))),
                     (to_regprocedure(format('pgrag_docs.%I(text[])',
                                             pgrag._generated('keys', doc_type, source_table))))
                 ) v(x) where x is not null loop
            execute format('drop function %s', f);
        end loop;
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
        begin
            execute format('create or replace trigger %I ' || t.event
                           || ' for each statement execute function %s()',
                           prefix || t.suffix, source_table, fn);
        exception when insufficient_privilege then
            -- (the privilege named, where "permission denied for table" left it to guess)
            raise exception using errcode = 'PR003',
                message = format('%s may not create triggers on %s, which %s watches',
                                 current_user, source_table, doc_type),
                hint = format('have its owner run `grant trigger on %s to %s;` (or declare as '
                              'the owner)', source_table, current_user);
        end;
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


create or replace function pgrag._chunks_deleted()
returns trigger
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- A partitioned store's stand-in for the foreign keys to pgrag.chunks (id) that a partitioned
-- table cannot have (sql/migrate/store_shape.sql): the chunks a statement deleted take their
-- children and their embedder errors with them, as ON DELETE CASCADE does in the one-table
-- store. The children's delete fires it again, one level down, until a level has none.
begin
    if not exists (select from gone) then
        return null;
    end if;
    delete from pgrag.embed_errors e where e.chunk_id in (select g.id from gone g);
    delete from pgrag.chunks c where c.parent_id in (select g.id from gone g);
    return null;
end
$fn$;


-- The trigger exists on a partitioned store only (the one-table store has its foreign keys);
-- a conversion makes a new table, so there is never one to drop.
do $$
begin
    if pgrag._store_partitioned()
       and not exists (select from pg_trigger
                        where tgrelid = 'pgrag.chunks'::regclass
                          and tgname = 'pgrag_chunks_cascade') then
        create trigger pgrag_chunks_cascade
            after delete on pgrag.chunks
            referencing old table as gone
            for each statement execute function pgrag._chunks_deleted();
    end if;
end
$$;
