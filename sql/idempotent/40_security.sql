-- Security: the reader and writer roles' grants, tenant isolation, sensitive columns.
-- Introduced by revision 0006: applied by that revision and every later one.
-- Re-applied by every migration that reaches head. docs/security.md explains the design.
--
-- Roles (names in pgrag.settings, chosen at migration time):
--   reader  searches, reads exact statistics and context: SELECT on the chunks (row-level
--           security: its tenant's chunks and the shared ones) and on the catalog tables;
--           nothing on any source table.
--   writer  also declares documents (CREATE on schema pgrag), renders them (writes chunks) and
--           embeds (the caches and the worker's tables). It sees every tenant's chunks: it
--           writes every tenant's source rows, and the worker embeds every chunk.
-- Functions are security invoker, except three, each minimal, with a fixed search_path, and
-- executable by the two roles only (not PUBLIC):
--   pgrag.current_tenant()        reads pgrag.tenant_roles, which readers may not read
--   pgrag.reader_doc_type_stats   runs a type's declared statistics over the source tables
--                                 for a reader (pgrag.doc_type_stats calls it)
--   pgrag.query_cache_get(...)    reads one cached question vector by hash
--
-- Tenants: a chunk's tenant is NULL (its type has no tenant column: every reader sees it) or the
-- value of its type's tenant column. A session's tenant is the binding in pgrag.tenant_roles of
-- its login role or of a role that one is a member of (SET ROLE cannot change it; conflicting
-- bindings: none), else the setting pgrag.tenant, else none: it then sees only the shared
-- (NULL) chunks.

create or replace function pgrag.session_role()
returns name
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The role the session acts as: SET ROLE's role, else the login role. Unlike current_user it
-- stays the caller's inside a security definer function.
return case when current_setting('role') = 'none' then session_user
            else current_setting('role')::name end;

comment on function pgrag.session_role() is
    'The role the session acts as (SET ROLE''s, else the login role), also inside definer functions';

create or replace function pgrag.tenant_identity()
returns name
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The role whose tenant bindings apply: the login role (session_user), which SET ROLE cannot
-- change, and SET SESSION AUTHORIZATION only for a superuser's session. For a superuser's
-- session (which may become anyone anyway) the role it acts as, so that a superuser can act as
-- a bound role with SET ROLE (tests, an administrator checking what a tenant sees).
return case when not coalesce((select r.rolsuper from pg_roles r where r.rolname = session_user),
                              false)
            then session_user
            else pgrag.session_role() end;

comment on function pgrag.tenant_identity() is
    'The role whose tenant bindings apply: the login role (SET ROLE cannot change it); '
    'a superuser''s session: the role it acts as';

create or replace function pgrag.current_tenant()
returns text
language sql stable security definer
set search_path = pg_catalog, pg_temp
-- security definer: it reads pgrag.tenant_roles, which no reader may read (it lists every
-- tenant and role). It takes no argument and returns only the calling session's own tenant.
-- The bindings that apply are those of pgrag.tenant_identity() (the login role) and of every
-- role it is a member of, directly or not, whatever the membership's INHERIT and SET options:
--   none      the setting pgrag.tenant (NULL when unset or empty: only the shared chunks)
--   one       that tenant, whatever the session sets or which role it SETs
--   several   NULL: conflicting bindings see only the shared chunks (fail closed)
-- (pg_auth_members walked by hand: pg_has_role says a superuser is a member of every role.)
return (
    with recursive member_of(oid) as (
        select r.oid from pg_roles r where r.rolname = pgrag.tenant_identity()
        union
        select m.roleid from pg_auth_members m join member_of on m.member = member_of.oid
    ),
    bound as (
        select distinct b.tenant
          from pgrag.tenant_roles b
          join pg_roles r on r.rolname = b.role_name
          join member_of on member_of.oid = r.oid
    )
    select case (select count(*) from bound)
               when 0 then nullif(current_setting('pgrag.tenant', true), '')
               when 1 then (select bound.tenant from bound)
           end);

comment on function pgrag.current_tenant() is
    'The session''s tenant: the binding (pgrag.tenant_roles) of its login role or a role it is '
    'a member of, else the setting pgrag.tenant; NULL (shared chunks only) if bindings conflict';

create or replace function pgrag.sees_all_tenants()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- What row-level security lets the session's role see of pgrag.chunks: every row for a
-- superuser, a BYPASSRLS role, the table's owner and the writer role's members.
return coalesce((
    select r.rolsuper or r.rolbypassrls
        or pg_has_role(r.oid, (select c.relowner from pg_class c
                               where c.oid = 'pgrag.chunks'::regclass), 'USAGE')
        or pg_has_role(r.oid, (select s.writer_role from pgrag.settings s), 'USAGE')
    from pg_roles r
    where r.rolname = pgrag.session_role()), false);

comment on function pgrag.sees_all_tenants() is
    'Whether the session''s role sees every tenant''s chunks (owner, writer, superuser, BYPASSRLS)';

create or replace function pgrag.bind_tenant_role(role_name name, tenant text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- Bind a role to a tenant (NULL: unbind it). Only the owner of pgrag.tenant_roles (the migrating
-- role) may: no grant on it is given to the reader or writer role.
begin
    if not exists (select 1 from pg_roles r where r.rolname = role_name) then
        raise exception using errcode = 'PR006',
            message = format('role %s does not exist', role_name),
            hint = 'create the role first (create role ... login), then bind it';
    end if;
    if tenant is null then
        delete from pgrag.tenant_roles b where b.role_name = role_name;
    elsif tenant = '' then
        raise exception using errcode = 'PR006',
            message = format('the tenant of role %s is empty', role_name),
            hint = 'pass the tenant''s value, or NULL to unbind the role';
    else
        insert into pgrag.tenant_roles as b (role_name, tenant) values (role_name, tenant)
        on conflict on constraint tenant_roles_pkey do update set tenant = excluded.tenant;
    end if;
end
$$;

comment on function pgrag.bind_tenant_role(name, text) is
    'Bind a role to a tenant (NULL: unbind): its sessions see only that tenant, whatever pgrag.tenant says';

-- ---- sensitive columns: cut out of chunks at render time ----

create or replace function pgrag.redact_text(t text, secrets jsonb, modes jsonb)
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

comment on function pgrag.redact_text(text, jsonb, jsonb) is
    'A text with the values of sensitive columns cut out (omit) or replaced by [masked <column>]';

create or replace function pgrag.redact_jsonb(j jsonb, secrets jsonb, modes jsonb)
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
            return (select coalesce(jsonb_object_agg(pgrag.redact_text(e.key, secrets, modes),
                                                     pgrag.redact_jsonb(e.value, secrets, modes)),
                                    '{}'::jsonb)
                    from jsonb_each(j) e);
        when 'array' then
            return (select coalesce(jsonb_agg(pgrag.redact_jsonb(e.value, secrets, modes)
                                              order by e.n), '[]'::jsonb)
                    from jsonb_array_elements(j) with ordinality e(value, n));
        when 'string' then
            return to_jsonb(pgrag.redact_text(j #>> '{}', secrets, modes));
        when 'number', 'boolean' then
            s := pgrag.redact_text(j #>> '{}', secrets, modes);
            return case when s = j #>> '{}' then j else to_jsonb(s) end;
        else
            return j;
    end case;
end
$$;

comment on function pgrag.redact_jsonb(jsonb, jsonb, jsonb) is
    'pgrag.redact_text on every key and scalar of a JSON value (chunk metadata)';

-- ---- the definer functions that replace earlier revisions' invoker ones ----

-- Replaces 30_search.sql's version (the downgrade of 0006 drops this one and re-applies it).
create or replace function pgrag.doc_type_stats(doc_type text, chunk_ids bigint[])
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- A session that sees every tenant (the owner, the writer, a superuser) runs the declared query
-- itself, with its own privileges, as before revision 0006. Any other (a reader) gets it from
-- pgrag.reader_doc_type_stats, over the chunks it may see.
declare
    body text;
    result jsonb;
begin
    if not pgrag.sees_all_tenants() then
        return pgrag.reader_doc_type_stats(doc_type, chunk_ids);
    end if;
    select s.stats_sql into body from pgrag.doc_stats s where s.doc_type = doc_type_stats.doc_type;
    if body is null then
        return null;
    end if;
    execute pgrag.stats_statement(body, 'c.id = any($1) and c.doc_type = $2', true)
        into result using chunk_ids, doc_type;
    return result;
end
$$;

comment on function pgrag.doc_type_stats(text, bigint[]) is
    'Run the declared statistics query of a document type over the given chunks (the CTE hits); '
    'readers through pgrag.reader_doc_type_stats';

create or replace function pgrag.doc_type_stats_where(doc_type text, condition text)
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- pgrag.doc_type_stats over the chunks (alias c) of doc_type matching `condition`, a boolean
-- SQL expression with its values written as literals (the Python client's compiled filter):
-- for a session that sees every tenant, the declared query runs over those chunks in one pass,
-- where the id list of doc_type_stats reads each matching chunk twice (at 10,000 matches, most
-- of the statement's time). Any other session (a reader) gets pgrag.reader_doc_type_stats over
-- the ids it may see, as before. It runs as the caller; through a cursor, which refuses a
-- string of several statements (pgrag.check_one_statement).
declare
    body text;
    cur refcursor;
    result jsonb;
begin
    if pgrag.sees_all_tenants() then
        select s.stats_sql into body
          from pgrag.doc_stats s where s.doc_type = doc_type_stats_where.doc_type;
        if body is null then
            return null;
        end if;
        open cur no scroll for execute
            pgrag.stats_statement(body, format('c.doc_type = $1 and (%s)', condition))
            using doc_type;
    else
        open cur no scroll for execute format(
            'select pgrag.reader_doc_type_stats($1, array(select c.id from pgrag.chunks c '
            'where c.doc_type = $1 and (%s)))', condition)
            using doc_type;
    end if;
    fetch cur into result;
    close cur;
    return result;
end
$$;

comment on function pgrag.doc_type_stats_where(text, text) is
    'A document type''s statistics over its chunks matching a condition with literal values, '
    'in one pass (readers through pgrag.reader_doc_type_stats)';

-- Replaces 30_search.sql's version (the downgrade of 0006 re-applies that one).
create or replace function pgrag.common_lexemes(min_fraction real default 0.05,
                                                min_rows bigint default 20000)
returns text[]
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
-- security definer, owned by the migrating role (the owner of pgrag.chunks): pg_stats hides the
-- statistics of a table while row-level security applies to the role asking, and it applies to
-- the writer role too (its policy lets it see everything, but is a policy). The words are read
-- for the roles that see every tenant anyway; a reader gets none, since the most common words
-- of all chunks would tell it about other tenants' chunks.
begin
    if not pgrag.sees_all_tenants() then
        return '{}';
    end if;
    return pgrag.stats_common_lexemes(min_fraction, min_rows);
end
$$;

comment on function pgrag.common_lexemes(real, bigint) is
    'The lexemes an any-word search leaves out: in at least min_fraction and min_rows chunks '
    '(none for a reader; security definer)';

-- Replaces 30_search.sql's version (the downgrade of 0006 re-applies that one): one pass.
create or replace function pgrag.stats(filter jsonb default null, doc_types text[] default null)
returns jsonb
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(jsonb_object_agg(s.doc_type, pgrag.doc_type_stats_where(
               s.doc_type,
               case when filter is null then 'true'
                    else format('c.metadata @> %L::jsonb', filter) end)), '{}'::jsonb)
    from pgrag.doc_stats s
    where doc_types is null or s.doc_type = any(doc_types)
$$;

comment on function pgrag.stats(jsonb, text[]) is
    'Exact statistics over every chunk matching metadata @> filter, per document type with '
    'declared statistics: {"doc_type": {...}, ...}';

create or replace function pgrag.reader_doc_type_stats(doc_type text, chunk_ids bigint[])
returns jsonb
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
-- security definer, owned by the writer role (below): a reader gets exact aggregates over the
-- source tables without SELECT on them, which the writer role holds. Why it is safe:
--   * the query it runs is the type's pgrag.doc_stats.stats_sql, which only the writer role may
--     declare (pgrag.declare_stats), and it runs with the writer role's privileges, no more;
--   * the caller's arguments are bound parameters, never spliced into SQL;
--   * hits holds only the chunks the calling session may see: row-level security does not
--     apply to the writer role, so the chunks policy is applied here, for the session's role
--     and tenant (pgrag.current_tenant, pgrag.sees_all_tenants), whatever ids are passed.
declare
    body text;
    result jsonb;
begin
    select s.stats_sql into body
      from pgrag.doc_stats s where s.doc_type = reader_doc_type_stats.doc_type;
    if body is null then
        return null;
    end if;
    execute pgrag.stats_statement(
        body,
        'c.id = any($1) and c.doc_type = $2 and (c.tenant is null or c.tenant = $3 or $4)',
        true)
        into result using chunk_ids, doc_type, pgrag.current_tenant(), pgrag.sees_all_tenants();
    return result;
end
$$;

comment on function pgrag.reader_doc_type_stats(text, bigint[]) is
    'A document type''s statistics over the given chunks the session may see; security definer, '
    'owned by the writer role, so readers need no SELECT on source tables';

-- Replaces 20_embeddings.sql's version (the downgrade of 0006 drops this one and re-applies it).
create or replace function pgrag.query_cache_get(model_name text, hash bytea, ttl interval)
returns vector
language sql stable security definer
set search_path = pg_catalog, pg_temp
-- security definer: a reader may use the shared query cache without reading it (its question
-- texts are other tenants' questions). It returns one vector, for an exact hash, nothing else.
-- Readers do not write it (pgrag.query_cache_put is invoker, and only the writer may).
as $$
    select q.embedding
    from pgrag.query_cache q
    where q.model = model_name and q.query_hash = hash and q.created_at > now() - ttl
$$;

comment on function pgrag.query_cache_get(text, bytea, interval) is
    'The cached vector of a normalized question, if younger than ttl (security definer)';

-- ---- policies and grants, for the role names in pgrag.settings ----

do $$
declare
    s pgrag.settings;
    f text;
    p regprocedure;
begin
    select * into strict s from pgrag.settings;

    -- An existing role is reused as it is (roles are cluster-wide). A reader that bypasses
    -- row-level security, or may become a role that does, would see every tenant: refuse.
    select string_agg(why, '; ') into f from (
        select format('%I is a superuser', r.rolname) as why
          from pg_roles r where r.rolname = s.reader_role and r.rolsuper
        union all
        select format('%I has BYPASSRLS', r.rolname)
          from pg_roles r where r.rolname = s.reader_role and r.rolbypassrls
        union all
        select format('%I is a member of %I', s.reader_role, o.rolname)
          from pg_roles r, pg_roles o
         where r.rolname = s.reader_role and not r.rolsuper
           and o.rolname in (s.writer_role,
                             (select c.relowner::regrole::name from pg_class c
                               where c.oid = 'pgrag.chunks'::regclass))
           and pg_has_role(r.oid, o.oid, 'MEMBER')) x;
    if f is not null then
        raise exception using errcode = 'PR006',
            message = format('the reader role %I would see every tenant''s chunks: %s',
                             s.reader_role, f),
            hint = format('have a DBA run `alter role %1$I nosuperuser nobypassrls;` and '
                          '`revoke %2$I, %3$I from %1$I;`, then migrate again',
                          s.reader_role, s.writer_role,
                          (select c.relowner::regrole::name from pg_class c
                            where c.oid = 'pgrag.chunks'::regclass));
    end if;

    -- Row-level security on pgrag.chunks (enabled by revision 0006). The owner and superusers
    -- bypass it; the subquery makes pgrag.current_tenant() run once per statement, not per row.
    drop policy if exists chunks_read on pgrag.chunks;
    create policy chunks_read on pgrag.chunks for select
        using (tenant is null or tenant = (select pgrag.current_tenant()));
    drop policy if exists chunks_write on pgrag.chunks;
    execute format('create policy chunks_write on pgrag.chunks for all to %I '
                   'using (true) with check (true)', s.writer_role);

    execute format('alter function pgrag.reader_doc_type_stats(text, bigint[]) owner to %I',
                   s.writer_role);
    foreach f in array array['pgrag.current_tenant()',
                             'pgrag.reader_doc_type_stats(text, bigint[])',
                             'pgrag.query_cache_get(text, bytea, interval)'] loop
        execute format('revoke all on function %s from public', f);
        execute format('grant execute on function %s to %I, %I', f, s.reader_role, s.writer_role);
    end loop;

    -- What changes documents or vectors is the writer's alone (the owner may always):
    -- the tables behind these are closed to readers anyway; this makes the refusal a clear
    -- "permission denied for function". bind_tenant_role is the owner's alone.
    for p in select pr.oid::regprocedure from pg_proc pr
              where pr.pronamespace = 'pgrag'::regnamespace
                and pr.proname in ('declare_document', 'drop_document', 'refresh', 'declare_stats',
                                   'claim_chunks', 'release_chunks', 'store_embeddings',
                                   'record_embed_failures', 'clear_embed_errors', 'begin_reembed',
                                   'query_cache_put', 'prune_embedding_cache', 'bind_tenant_role')
    loop
        execute format('revoke all on function %s from public', p);
        if p::text not like 'pgrag.bind_tenant_role(%' then
            execute format('grant execute on function %s to %I', p, s.writer_role);
        end if;
    end loop;

    execute format('grant usage on schema pgrag to %I, %I', s.reader_role, s.writer_role);
    execute format('grant create on schema pgrag to %I', s.writer_role);
    execute format('grant select on pgrag.chunks, pgrag.doc_types, pgrag.doc_watches, '
                   'pgrag.doc_stats, pgrag.settings to %I, %I', s.reader_role, s.writer_role);
    execute format('grant insert, update, delete on pgrag.chunks, pgrag.doc_types, '
                   'pgrag.doc_watches, pgrag.doc_stats to %I', s.writer_role);
    execute format('grant select, insert, update, delete on pgrag.embedding_cache, '
                   'pgrag.query_cache, pgrag.embed_errors to %I', s.writer_role);
    execute format('grant update (embedding_model) on pgrag.settings to %I', s.writer_role);
    execute format('grant select, insert on pgrag.eval_runs to %I', s.writer_role);
    -- both check that the database is at pgrag's head revision (alembic's version table)
    execute format('grant select on public.pgrag_alembic_version to %I, %I',
                   s.reader_role, s.writer_role);
end
$$;
