-- Undo sql/idempotent: every function, trigger, policy and grant those files make, and the
-- triggers pgrag put on source tables for the declared types; the tables and their rows stay.
-- The first step of every downgrade (pgrag/migrate.py): below head, a database has pgrag's tables
-- only, until the pgrag release of that revision applies its own functions.
do $$
declare
    w record;
    suffix text;
    t regclass;
    r name;
    p regprocedure;
    pol record;
begin
    if to_regclass('pgrag.settings') is null then
        return;  -- nothing of pgrag here
    end if;
    -- The declared types' sync triggers: dropping one takes the table's owner (or a superuser).
    if to_regclass('pgrag.doc_watches') is not null then
        for w in select dw.doc_type, dw.source_table from pgrag.doc_watches dw
                  where exists (select from pg_class c where c.oid = dw.source_table) loop
            foreach suffix in array array['ins', 'upd', 'del', 'trn'] loop
                begin
                    execute format('drop trigger if exists %I on %s',
                                   format('pgrag_%s_%s', w.doc_type, suffix), w.source_table);
                exception when insufficient_privilege then
                    raise exception using errcode = 'PR006',
                        message = format('cannot drop pgrag''s trigger on %s: %s',
                                         w.source_table, sqlerrm),
                        hint = 'downgrade as a superuser or as the owner of that table; nothing '
                               'was changed';
                end;
            end loop;
        end loop;
    end if;
    -- The statistics cache's triggers (revision 0008), wherever they are.
    for t in select tg.tgrelid::regclass from pg_trigger tg
              where tg.tgname = 'pgrag_stats_changed' loop
        execute format('drop trigger pgrag_stats_changed on %s', t);
    end loop;
    if to_regclass('pgrag.sync_pending') is not null then
        drop trigger if exists pgrag_sync_at_commit on pgrag.sync_pending;
    end if;
    if to_regclass('pgrag.doc_stats') is not null then
        drop trigger if exists pgrag_stats_redeclared on pgrag.doc_stats;
    end if;
    -- Every policy on pgrag's tables.
    for pol in select p.polname, p.polrelid::regclass as tbl from pg_policy p
                 join pg_class c on c.oid = p.polrelid
                where c.relnamespace = 'pgrag'::regnamespace loop
        execute format('drop policy %I on %s', pol.polname, pol.tbl);
    end loop;
    -- The grants to the reader and writer roles (revision 0006); the roles stay.
    if exists (select from pg_attribute a where a.attrelid = 'pgrag.settings'::regclass
                                            and a.attname = 'reader_role' and not a.attisdropped)
    then
        for r in execute 'select unnest(array[reader_role, writer_role]) from pgrag.settings' loop
            continue when not exists (select from pg_roles x where x.rolname = r);
            execute format('revoke all on schema pgrag from %I', r);
            execute format('revoke all on all tables in schema pgrag from %I', r);
            execute format('revoke all on public.pgrag_alembic_version from %I', r);
            if to_regnamespace('pgrag_docs') is not null then
                execute format('revoke all on schema pgrag_docs from %I', r);
            end if;
        end loop;
    end if;
    -- The functions generated for declared types (revision 0009), owned by their declarers:
    -- dropping one takes its owner (or a superuser).
    if to_regnamespace('pgrag_docs') is not null then
        for p in select pr.oid::regprocedure from pg_proc pr
                  where pr.pronamespace = 'pgrag_docs'::regnamespace loop
            begin
                execute format('drop function %s', p);
            exception when insufficient_privilege then
                raise exception using errcode = 'PR006',
                    message = format('cannot drop %s: %s', p, sqlerrm),
                    hint = 'downgrade as a superuser or as a member of the role that declared '
                           'the type; nothing was changed';
            end;
        end loop;
    end if;
    -- Every function of schema pgrag but the one its tables use (the chunks' content_hash).
    for p in select pr.oid::regprocedure from pg_proc pr
              where pr.pronamespace = 'pgrag'::regnamespace and pr.proname <> 'text_sha256'
              order by pr.oid desc loop
        execute format('drop function %s', p);
    end loop;
end
$$;
