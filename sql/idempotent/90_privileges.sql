-- Who may do what: row-level security and every grant to the reader and writer roles, for the
-- role names in pgrag.settings (chosen at revision 0006). docs/security.md explains the design.
--
-- Roles:
--   reader  searches, reads exact statistics and context: SELECT on the chunks (row-level
--           security: its tenant's chunks and the shared ones) and on the catalog tables;
--           nothing on any source table.
--   writer  also declares documents (CREATE on schema pgrag_docs, where the functions generated
--           for its types go; nothing on schema pgrag but USAGE), renders them (writes chunks)
--           and embeds (the caches and the worker's tables). It sees every tenant's chunks: it
--           writes every tenant's source rows, and the worker embeds every chunk. It changes
--           only the catalog rows of the types it owns (or may act as): row-level security.
-- Every function is security invoker except the definers listed in DEFINERS below (each says
-- why in its own file); a test checks that pg_proc agrees.

-- Row-level security on pgrag.chunks (enabled by revision 0006) and on pgrag.stats_cache (0008).
-- The owner and superusers bypass it; the subquery makes pgrag.current_tenant() run once per
-- statement, not per row.
select pgrag._ensure_policy('pgrag.chunks', 'chunks_read', $p$
    create policy chunks_read on pgrag.chunks for select
        using (tenant is null or tenant = (select pgrag.current_tenant()))$p$);

-- The catalog: everyone reads it; a role inserts rows it owns (declaring records the declarer)
-- and changes or deletes only the rows of roles it may act as. What a row says (a view, a key
-- query, a statistics query) runs as the row's owner only (docs/security.md).
select pgrag._ensure_policy('pgrag.doc_types', 'doc_types_read', $p$
    create policy doc_types_read on pgrag.doc_types for select using (true)$p$);
-- A type's parent (doc_types.parent_type: the row's own, not the subquery's) must be a type of
-- a role it may act as: a child of another role's type keeps that role from dropping it or
-- giving it tenants (pgrag.declare_document says so first).
select pgrag._ensure_policy('pgrag.doc_types', 'doc_types_insert', $p$
    create policy doc_types_insert on pgrag.doc_types for insert
        with check (owner = current_user::regrole
                    and (parent_type is null
                         or exists (select from pgrag.doc_types p
                                     where p.name = doc_types.parent_type
                                       and pgrag._may_act_as(p.owner))))$p$);
select pgrag._ensure_policy('pgrag.doc_types', 'doc_types_update', $p$
    create policy doc_types_update on pgrag.doc_types for update
        using (pgrag._may_act_as(owner))
        with check (owner = current_user::regrole
                    and (parent_type is null
                         or exists (select from pgrag.doc_types p
                                     where p.name = doc_types.parent_type
                                       and pgrag._may_act_as(p.owner))))$p$);
select pgrag._ensure_policy('pgrag.doc_types', 'doc_types_delete', $p$
    create policy doc_types_delete on pgrag.doc_types for delete
        using (pgrag._may_act_as(owner))$p$);
select pgrag._ensure_policy('pgrag.doc_watches', 'doc_watches_read', $p$
    create policy doc_watches_read on pgrag.doc_watches for select using (true)$p$);
select pgrag._ensure_policy('pgrag.doc_watches', 'doc_watches_own', $p$
    create policy doc_watches_own on pgrag.doc_watches for all
        using (exists (select from pgrag.doc_types d
                        where d.name = doc_type and pgrag._may_act_as(d.owner)))
        with check (exists (select from pgrag.doc_types d
                             where d.name = doc_type and d.owner = current_user::regrole))$p$);
select pgrag._ensure_policy('pgrag.doc_stats', 'doc_stats_read', $p$
    create policy doc_stats_read on pgrag.doc_stats for select using (true)$p$);
select pgrag._ensure_policy('pgrag.doc_stats', 'doc_stats_insert', $p$
    create policy doc_stats_insert on pgrag.doc_stats for insert
        with check (owner = current_user::regrole
                    and exists (select from pgrag.doc_types d
                                 where d.name = doc_type and pgrag._may_act_as(d.owner)))$p$);
select pgrag._ensure_policy('pgrag.doc_stats', 'doc_stats_update', $p$
    create policy doc_stats_update on pgrag.doc_stats for update
        using (pgrag._may_act_as(owner))
        with check (pgrag._may_act_as(owner)
                    and exists (select from pgrag.doc_types d
                                 where d.name = doc_type and pgrag._may_act_as(d.owner)))$p$);
select pgrag._ensure_policy('pgrag.doc_stats', 'doc_stats_delete', $p$
    create policy doc_stats_delete on pgrag.doc_stats for delete
        using (pgrag._may_act_as(owner)
               or exists (select from pgrag.doc_types d
                           where d.name = doc_type and pgrag._may_act_as(d.owner)))$p$);

select pgrag._ensure_policy('pgrag.stats_cache', 'stats_cache_own', $p$
    create policy stats_cache_own on pgrag.stats_cache
        using (role_name = current_user) with check (role_name = current_user)$p$);

do $$
declare
    s pgrag.settings;
    f text;
    p regprocedure;
    -- The security definer functions (each says why in its own file), and who may call them:
    -- never PUBLIC. A trigger function needs EXECUTE only to create the trigger.
    definers constant text[] := array[
        'pgrag.current_tenant()',                         'reader writer',
        'pgrag.query_cache_get(text, bytea)',             'reader writer',
        'pgrag._common_lexemes(real, bigint)',            'reader writer',
        'pgrag._prune_stats_changes()',                   'writer',
        'pgrag.clean_pending_lists()',                    'writer',
        'pgrag.stats_changed()',                          'writer'];
    i integer;
    -- What changes documents, vectors, caches or bindings: the writer's alone (the owner may
    -- always); bind_tenant_role is the owner's alone.
    writer_only constant text[] := array[
        'declare_document', 'drop_document', 'refresh', 'declare_stats', 'cache_stats',
        'claim_chunks', 'release_chunks', 'store_embeddings', 'record_embed_failures',
        'clear_embed_errors', 'begin_reembed', 'query_cache_put', 'prune_embedding_cache',
        'index_text',
        'sync_now', 'render_queued', 'set_sync', 'describe_document', 'bind_tenant_role'];
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

    perform pgrag._ensure_policy('pgrag.chunks', 'chunks_write',
        format('create policy chunks_write on pgrag.chunks for all to %I '
               'using (true) with check (true)', s.writer_role));

    for i in 1 .. cardinality(definers) / 2 loop
        f := definers[2 * i - 1];
        execute format('revoke all on function %s from public', f);
        execute format('grant execute on function %s to %s', f,
                       case definers[2 * i] when 'writer' then quote_ident(s.writer_role)
                            else format('%I, %I', s.reader_role, s.writer_role) end);
    end loop;

    for p in select pr.oid::regprocedure from pg_proc pr
              where pr.pronamespace = 'pgrag'::regnamespace and pr.proname = any(writer_only)
    loop
        execute format('revoke all on function %s from public', p);
        execute format('revoke all on function %s from %I', p, s.reader_role);
        if p::text not like 'pgrag.bind_tenant_role(%' then
            execute format('grant execute on function %s to %I', p, s.writer_role);
        end if;
    end loop;

    execute format('grant usage on schema pgrag to %I, %I', s.reader_role, s.writer_role);
    -- Schema pgrag holds pgrag's own objects: nobody else creates there (a writer's function in
    -- it could be called by pgrag's code for a superuser). Declarers create in pgrag_docs.
    execute format('revoke create on schema pgrag from %I, %I', s.reader_role, s.writer_role);
    execute format('grant usage on schema pgrag_docs to %I, %I', s.reader_role, s.writer_role);
    execute format('grant create on schema pgrag_docs to %I', s.writer_role);
    execute format('grant select on pgrag.chunks, pgrag.doc_types, pgrag.doc_watches, '
                   'pgrag.doc_stats, pgrag.settings to %I, %I', s.reader_role, s.writer_role);
    execute format('grant insert, update, delete on pgrag.chunks, pgrag.doc_types, '
                   'pgrag.doc_watches, pgrag.doc_stats to %I', s.writer_role);
    execute format('grant select, insert, update, delete on pgrag.embedding_cache, '
                   'pgrag.query_cache, pgrag.embed_errors to %I', s.writer_role);
    execute format('grant update (embedding_model) on pgrag.settings to %I', s.writer_role);
    -- the worker tunes ef_search when the store grew or shrank twofold (pgrag/tune.py)
    execute format('grant update (ef_search) on pgrag.settings to %I', s.writer_role);
    -- pgrag.index_text records when it ran: only then does a commit asked to (pgrag.tsvector =
    -- worker) leave the tsvectors to the worker
    execute format('grant update (text_indexed_at) on pgrag.settings to %I', s.writer_role);
    execute format('grant select, insert on pgrag.tuning to %I', s.writer_role);
    execute format('grant select, insert on pgrag.eval_runs to %I', s.writer_role);
    -- the commit-time render's queue: written by every writer's statement triggers; the render
    -- queue, its errors and lag: written by them and the worker
    execute format('grant select, insert, delete on pgrag.sync_queue, pgrag.sync_pending to %I',
                   s.writer_role);
    execute format('grant select, insert, update, delete on pgrag.render_queue, '
                   'pgrag.render_errors, pgrag.render_lag to %I', s.writer_role);
    -- every tenant's cached statistics: the writer's (each role its own rows) and the owner's
    execute format('grant select, insert, update, delete on pgrag.stats_cache to %I',
                   s.writer_role);
    -- read only: pruning them is pgrag._prune_stats_changes's (a security definer), so that no
    -- writer can delete the changes that make another role's cached statistics stale
    execute format('grant select on pgrag.stats_cache_horizon, pgrag.stats_changes to %I',
                   s.writer_role);
    execute format('revoke update, delete on pgrag.stats_cache_horizon, pgrag.stats_changes '
                   'from %I', s.writer_role);
    -- both check that the database is at pgrag's head revision (alembic's version table)
    execute format('grant select on public.pgrag_alembic_version to %I, %I',
                   s.reader_role, s.writer_role);
end
$$;
