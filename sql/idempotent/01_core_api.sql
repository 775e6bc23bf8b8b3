-- The SQL API of the store itself: its dimension, its size, and the session's tenant
-- (docs/security.md, Tenants).

create or replace function pgrag.embedding_dim()
returns integer
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$ select embedding_dim from pgrag.settings $$;

comment on function pgrag.embedding_dim() is 'The vector dimension this store was migrated with';


create or replace function pgrag.check_dimension(dim integer)
returns void
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    stored integer := pgrag.embedding_dim();
begin
    if dim is distinct from stored then
        raise exception using
            errcode = 'PR002',
            message = format('embedding dimension %s does not match this store''s %s', dim, stored),
            hint = 'use a model with the stored dimension, or re-embed with `pgrag reembed --model ...`'
                   ' (or migrate a fresh database with `pgrag db upgrade --dimension N`)';
    end if;
end
$$;

comment on function pgrag.check_dimension(integer) is
    'Refuse (PR002) a vector dimension other than the store''s';


select pgrag._drop_if_changed(to_regprocedure('pgrag.status()'),
    'TABLE(embedding_dim integer, embedding_model text, chunks bigint, pending bigint, '
    'doc_types jsonb, render_queued bigint, render_oldest interval, render_lag jsonb, '
    'render_errors bigint, tuning jsonb, replication jsonb, store jsonb, text_pending bigint)');

create or replace function pgrag.status()
returns table (
    embedding_dim integer,
    embedding_model text,
    chunks bigint,
    pending bigint,
    doc_types jsonb,
    render_queued bigint,    -- entries of pgrag.render_queue (NULL: the caller may not read it)
    render_oldest interval,  -- the age of the oldest one
    render_lag jsonb,        -- the worker's render lag over the last 15 minutes:
                             -- {"documents", "p50_ms", "p95_ms", "max_ms"}
    render_errors bigint,    -- documents whose last render failed (pgrag verify lists them)
    tuning jsonb,            -- the last recall measurement (pgrag.tuning; NULL: none, or the
                             -- caller may not read it): ef_search, recall, target, k, chunks,
                             -- best_ef_search, model, measured_at, tuned_by
    replication jsonb,       -- this server's place in streaming replication (docs/scaling.md):
                             -- a primary's standbys {"role": "primary", "standbys": [{name,
                             -- state, replay_lag_ms}]} (a role without pg_monitor sees their
                             -- names only), or {"role": "standby", "received_not_replayed_bytes",
                             -- "last_replayed_commit_age_ms"}
    store jsonb,             -- the chunk store's partitions (pgrag._store_shape()): NULL for
                             -- one table, else {"by": "tenant", "strategy": "list" | "hash",
                             -- "partitions", "default_rows" (list: chunks of tenants without
                             -- a partition of their own)}
    text_pending bigint      -- chunks waiting for their full-text vector (pgrag.index_text; searches
                             -- compute it meanwhile)
)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- (The render figures read tables only the writer may: a reader gets NULLs. PostgreSQL checks
-- every table a statement names before it runs, so they are read by statements of their own.)
declare
    r record;
begin
    select s.embedding_dim as dim, s.embedding_model as model,
           (select count(*) from pgrag.chunks) as n,
           (select count(*) from pgrag.chunks c where c.embedding is null) as waiting,
           (select count(*) from pgrag.chunks c where c.tsv is null) as text_waiting,
           coalesce((select jsonb_object_agg(t.doc_type, t.n)
                       from (select c.doc_type, count(*) as n from pgrag.chunks c
                              group by c.doc_type) t), '{}'::jsonb) as types
      into r from pgrag.settings s;
    embedding_dim := r.dim;
    embedding_model := r.model;
    chunks := r.n;
    pending := r.waiting;
    text_pending := r.text_waiting;
    doc_types := r.types;
    if has_table_privilege('pgrag.render_queue', 'select') then
        select count(*), clock_timestamp() - min(q.queued_at) into render_queued, render_oldest
          from pgrag.render_queue q;
        select jsonb_build_object(
                   'documents', (select coalesce(sum(b.documents), 0) from pgrag.render_lag b
                                  where b.rendered_at > now() - interval '15 minutes'),
                   'p50_ms', round(percentile_cont(0.5) within group (order by x)::numeric, 1),
                   'p95_ms', round(percentile_cont(0.95) within group (order by x)::numeric, 1),
                   'max_ms', round(max(x)::numeric, 1))
          into render_lag
          from pgrag.render_lag b, unnest(b.lags_ms) x
         where b.rendered_at > now() - interval '15 minutes';
        select count(*) into render_errors from pgrag.render_errors;
    end if;
    if has_table_privilege('pgrag.tuning', 'select') then
        select to_jsonb(t) - 'id' - 'queries' - 'source' into tuning
          from pgrag.tuning t order by t.id desc limit 1;
    end if;
    if pg_is_in_recovery() then
        replication := jsonb_build_object(
            'role', 'standby',
            'received_not_replayed_bytes',
            pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()),
            'last_replayed_commit_age_ms',
            round((extract(epoch from clock_timestamp() - pg_last_xact_replay_timestamp())
                   * 1000)::numeric));
    else
        select jsonb_build_object(
                   'role', 'primary',
                   'standbys', coalesce(jsonb_agg(jsonb_build_object(
                       'name', sr.application_name, 'state', sr.state,
                       'replay_lag_ms',
                       round((extract(epoch from sr.replay_lag) * 1000)::numeric))
                       order by sr.application_name), '[]'::jsonb))
          into replication
          from pg_stat_replication sr;
    end if;
    store := pgrag._store_shape();
    return next;
end
$fn$;

comment on function pgrag.status() is
    'Store size, chunks waiting for a vector (and for a full-text vector), chunks per document '
    'type, the render queue, its '
    'lag, render errors, the last recall measurement, the server''s replication and the '
    'store''s partitions';


create or replace function pgrag.current_tenant()
returns text
language sql stable security definer
set search_path = pg_catalog, pg_temp
-- security definer: it reads pgrag.tenant_roles, which no reader may read (it lists every
-- tenant and role). It takes no argument and returns only the calling session's own tenant.
-- The bindings that apply are those of pgrag._tenant_identity() (the login role) and of every
-- role it is a member of, directly or not, whatever the membership's INHERIT and SET options:
--   none      the setting pgrag.tenant (NULL when unset or empty: only the shared chunks)
--   one       that tenant, whatever the session sets or which role it SETs
--   several   NULL: conflicting bindings see only the shared chunks (fail closed)
-- (pg_auth_members walked by hand: pg_has_role says a superuser is a member of every role.)
return (
    with recursive member_of(oid) as (
        select r.oid from pg_roles r where r.rolname = pgrag._tenant_identity()
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

