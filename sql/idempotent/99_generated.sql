-- Regenerate every declared type's generated functions (10_documents_int.sql,
-- 40_stats_int.sql) and triggers against this version of pgrag, so that an upgrade reaches the
-- types declared before it. Last: it calls the functions of every file above.
--
-- Each type's objects are made by the role that declared it (doc_types.owner; its statistics:
-- doc_stats.owner): the migration acts as that role (SET ROLE) for them, so that they are that
-- role's, as a declaration made them. Nothing here plans or runs what the role declared: it
-- only creates functions and triggers. A migrating role that may not act as a type's owner
-- stops with the fix (a superuser may act as anyone; a DBA migrating as a member of the writer
-- role may act as the writer role, which the docs ask declarations to be made as).
--
-- From the releases before 0009, whose generated functions and views were in schema pgrag: the
-- views pgrag made from declarations' queries move to pgrag_docs (the type keeps them: the
-- same relation), the old functions are dropped once the new ones and their triggers exist.
do $$
declare
    migrator name := current_user;
    t record;
    w record;
    v regclass;
    f regprocedure;
    who regrole;
begin
    for who in select distinct o from (
                   select d.owner as o from pgrag.doc_types d
                   union select s.owner from pgrag.doc_stats s) x loop
        begin
            execute format('set local role %s', who);
        exception when insufficient_privilege or invalid_parameter_value then
            raise exception using errcode = 'PR006',
                message = format('the migrating role %I may not act as %s, who declared document '
                                 'types or statistics: their functions cannot be regenerated',
                                 migrator, who),
                hint = format('migrate as a superuser, or `grant %s to %I;` and migrate again',
                              who, migrator);
        end;
        for t in select d.name, d.source, d.owns_source from pgrag.doc_types d
                  where d.owner = who and exists (select from pg_class c where c.oid = d.source) loop
            v := t.source;
            if t.owns_source
               and (select c.relnamespace from pg_class c where c.oid = v) = 'pgrag'::regnamespace
            then
                execute format('alter view %s set schema pgrag_docs', v);
            end if;
            -- A type that cannot be regenerated (its catalog row written by hand: its declarer
            -- may write it) is named, and the upgrade goes on for every other type
            begin
                perform pgrag._create_render_function(t.name);
            exception when others then
                raise warning using message = format(
                    'pgrag: the functions of document type %s were not regenerated: %s',
                    t.name, sqlerrm),
                    hint = format('declare %s again (as %s), or drop it', t.name, who);
            end;
        end loop;
        for w in select dw.doc_type, dw.source_table
                   from pgrag.doc_watches dw join pgrag.doc_types d on d.name = dw.doc_type
                  where d.owner = who
                    and exists (select from pg_class c where c.oid = dw.source_table) loop
            -- A watch its declarer may no longer trigger on (a grant revoked, or a catalog row
            -- written by hand: a writer role may write its own) does not stop the upgrade of
            -- every other type: it is named, and that table's writes are not followed until
            -- the grant is back and the type declared again (pgrag verify shows the drift).
            begin
                perform pgrag._create_sync_triggers(w.doc_type, w.source_table);
            exception when others then
                raise warning using message = format('pgrag: %s', sqlerrm),
                    detail = format('the triggers of %s on %s were not created: writes to that '
                                    'table do not reach its documents', w.doc_type,
                                    w.source_table),
                    hint = format('grant the privilege and declare %s again, or drop the watch',
                                  w.doc_type);
            end;
        end loop;
        for t in select s.doc_type as name from pgrag.doc_stats s where s.owner = who loop
            perform pgrag._create_stats_function(t.name);
        end loop;
        -- the functions of schema pgrag that releases before 0009 generated for these types
        for f in select p.oid::regprocedure from pg_proc p
                  where p.pronamespace = 'pgrag'::regnamespace and p.proowner = who
                    and (p.proname ~ '^(render|store)_[a-z][a-z0-9_]{0,39}$'
                         and regexp_replace(p.proname, '^(render|store)_', '')
                             in (select d.name from pgrag.doc_types d)
                         or p.proname ~ '^(sync|keys)_[a-z][a-z0-9_]*_[0-9a-f]{10}$') loop
            execute format('drop function %s', f);
        end loop;
        execute format('set local role %I', migrator);
    end loop;
end
$$;
