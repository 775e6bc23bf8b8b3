-- Undo 0006 exactly: the policies, grants and functions of idempotent/40_security.sql, then the
-- columns and tables. The roles stay: they are cluster-wide, may serve other databases and be
-- granted to login roles (docs/security.md: drop them by hand). The revision's downgrade then
-- re-applies the idempotent files of 0005, which restores the functions 40_security.sql replaced
-- and regenerates every type's functions without tenants or masking.
--
-- Refused while a document type uses a tenant column or sensitive columns: without this
-- revision their next render would store every tenant's rows for every reader, unmasked.
do $$
declare
    s pgrag.settings;
    r name;
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
    select * into strict s from pgrag.settings;
    drop policy chunks_read on pgrag.chunks;
    drop policy chunks_write on pgrag.chunks;
    alter table pgrag.chunks disable row level security;
    foreach r in array array[s.reader_role, s.writer_role] loop
        execute format('revoke all on schema pgrag from %I', r);
        execute format('revoke all on pgrag.chunks, pgrag.doc_types, pgrag.doc_watches, '
                       'pgrag.doc_stats, pgrag.settings, pgrag.embedding_cache, '
                       'pgrag.query_cache, pgrag.embed_errors, pgrag.eval_runs, '
                       'public.pgrag_alembic_version from %I', r);
    end loop;
end
$$;
-- Functions of earlier revisions whose privileges 0006 changed, or which it replaced: the
-- revision's downgrade re-creates them from the 0005 files, with their default privileges.
do $$
declare
    p regprocedure;
begin
    for p in select pr.oid::regprocedure from pg_proc pr
              where pr.pronamespace = 'pgrag'::regnamespace
                and pr.proname in ('declare_document', 'drop_document', 'refresh', 'declare_stats',
                                   'claim_chunks', 'release_chunks', 'store_embeddings',
                                   'record_embed_failures', 'clear_embed_errors', 'begin_reembed',
                                   'query_cache_put', 'prune_embedding_cache', 'doc_type_stats',
                                   'query_cache_get')
    loop
        execute format('drop function %s', p);
    end loop;
end
$$;
drop function pgrag.doc_type_stats_where(text, text);
drop function pgrag.reader_doc_type_stats(text, bigint[]);
drop function pgrag.redact_jsonb(jsonb, jsonb, jsonb);
drop function pgrag.redact_text(text, jsonb, jsonb);
drop function pgrag.bind_tenant_role(name, text);
drop function pgrag.sees_all_tenants();
drop function pgrag.current_tenant();
drop function pgrag.tenant_identity();
drop function pgrag.session_role();
drop table pgrag.tenant_roles;
drop index pgrag.chunks_tenant;
alter table pgrag.chunks drop column tenant;
alter table pgrag.doc_types drop column tenant_column, drop column sensitive;
alter table pgrag.settings drop constraint settings_roles_differ,
    drop column reader_role, drop column writer_role;
