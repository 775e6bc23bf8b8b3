-- 0006: security: the reader and writer roles, tenants, sensitive columns.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- Read from session settings set by the migration runner (pgrag/migrate.py):
--   pgrag.reader_role   the role that may search (default pgrag_reader)
--   pgrag.writer_role   the role that may also declare documents and embed (default pgrag_writer)
--
-- The grants, the row-level security policies and the functions they use live in
-- sql/idempotent/40_security.sql; docs/security.md explains the whole design.

alter table pgrag.settings
    add column reader_role name,
    add column writer_role name;

update pgrag.settings
set reader_role = coalesce(nullif(current_setting('pgrag.reader_role', true), ''), 'pgrag_reader'),
    writer_role = coalesce(nullif(current_setting('pgrag.writer_role', true), ''), 'pgrag_writer');

alter table pgrag.settings
    alter column reader_role set not null,
    alter column writer_role set not null,
    add constraint settings_roles_differ check (reader_role <> writer_role);

-- Roles are cluster-wide: create them only when missing (NOLOGIN groups a DBA grants to login
-- roles). Without CREATEROLE, stop with the statements a DBA must run first.
do $$
declare
    s pgrag.settings;
    r name;
    may_create boolean;
begin
    select * into strict s from pgrag.settings;
    select rolsuper or rolcreaterole into may_create from pg_catalog.pg_roles
     where rolname = current_user;
    foreach r in array array[s.reader_role, s.writer_role] loop
        continue when exists (select 1 from pg_catalog.pg_roles where rolname = r);
        if not may_create then
            raise exception using
                errcode = 'PR006',
                message = format('role %I does not exist and %I may not create roles',
                                 r, current_user),
                hint = format('have a DBA run `create role %I nologin; create role %I nologin; '
                              'grant %I to %I;` and migrate again, or name existing roles with '
                              '--reader-role and --writer-role', s.reader_role, s.writer_role,
                              s.writer_role, current_user);
        end if;
        execute format('create role %I nologin', r);
        execute format('comment on role %I is %L', r,
                       case when r = s.reader_role
                            then 'pgrag: may search its tenant''s chunks and read exact statistics'
                            else 'pgrag: may also declare documents, render them and embed' end);
    end loop;
    -- The migrating role owns pgrag's objects but hands one function to the writer role
    -- (pgrag.doc_type_stats runs as the writer): it must be a member to do so and to replace it.
    if not pg_catalog.pg_has_role(current_user, s.writer_role, 'MEMBER') then
        begin
            execute format('grant %I to %I', s.writer_role, current_user);
        exception when insufficient_privilege then
            raise exception using
                errcode = 'PR006',
                message = format('%I is not a member of the writer role %I and may not join it',
                                 current_user, s.writer_role),
                hint = format('have a DBA run `grant %I to %I;` and migrate again',
                              s.writer_role, current_user);
        end;
    end if;
end
$$;

-- The tenant of a chunk: NULL for document types without a tenant column (every reader sees
-- them), the tenant column's value otherwise ('' when that value is NULL: no reader sees it).
alter table pgrag.chunks add column tenant text;

create index chunks_tenant on pgrag.chunks (tenant);

alter table pgrag.doc_types
    add column tenant_column text,
    add column sensitive jsonb not null default '{}'::jsonb
        check (jsonb_typeof(sensitive) = 'object');

comment on column pgrag.doc_types.tenant_column is
    'The source column holding each document''s tenant (NULL: the type is not tenant-scoped)';
comment on column pgrag.doc_types.sensitive is
    'Source columns whose values never reach chunks: {"column": "omit" | "mask"}';

-- Roles bound to one tenant: such a role sees that tenant whatever pgrag.tenant says.
create table pgrag.tenant_roles (
    role_name name primary key,
    tenant text not null check (tenant <> ''),
    created_at timestamptz not null default now()
);

comment on table pgrag.tenant_roles is
    'Roles bound to a tenant: their sessions see only that tenant''s chunks (pgrag.tenant is ignored)';

-- Row-level security: the policies are in sql/idempotent/40_security.sql. The table's owner (the
-- migrating role) and superusers bypass them; every other role sees only what a policy allows.
alter table pgrag.chunks enable row level security;
