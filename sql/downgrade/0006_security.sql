-- Undo 0006 exactly (after idempotent.sql removed the policies, grants and functions): the
-- columns and tables. The roles stay: they are cluster-wide, may serve other databases and be
-- granted to login roles (docs/security.md: drop them by hand).
--
-- Refused while a document type uses a tenant column or sensitive columns: below this revision
-- the declaration cannot say so, and the type's next render would store every tenant's rows for
-- every reader, unmasked.
do $$
declare
    secured text;
begin
    select string_agg(d.name, ', ' order by d.name) into secured
      from pgrag.doc_types d where d.tenant_column is not null or d.sensitive <> '{}';
    if secured is not null then
        raise exception using errcode = 'PR006',
            message = format('document type(s) %s use a tenant column or sensitive columns, which '
                             'revision 0005 cannot protect', secured),
            hint = 'drop them, or re-declare them without tenant_column and sensitive, then '
                   'downgrade again';
    end if;
end
$$;
alter table pgrag.chunks disable row level security;
drop table pgrag.tenant_roles;
drop index pgrag.chunks_tenant;
alter table pgrag.chunks drop column tenant;
alter table pgrag.doc_types drop column tenant_column, drop column sensitive;
alter table pgrag.settings drop constraint settings_roles_differ,
    drop column reader_role, drop column writer_role;
