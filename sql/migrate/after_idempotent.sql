-- After the idempotent files ran (pgrag/migrate.py): drop pgrag's functions of schema pgrag that
-- they no longer define, so each function has exactly one definition, the current one. Kept: the
-- chunks' content_hash function (a table uses it). The functions generated for declared types
-- are in schema pgrag_docs (99_generated.sql drops those of earlier releases in schema pgrag).
-- A function another object depends on (a view of yours calling it) stops the migration with
-- its name: nothing is dropped with CASCADE.
do $$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure
               from pg_catalog.pg_proc p
               join pgrag_migration_functions m on m.oid = p.oid and m.version = p.xmin::text
              where p.proname <> 'text_sha256'
                -- pgrag's own: the schema owner's or the migrating role's (a function a writer
                -- created in schema pgrag before 0009 is the writer's, and stays)
                and p.proowner in ((select n.nspowner from pg_catalog.pg_namespace n
                                     where n.nspname = 'pgrag'),
                                   (select r.oid from pg_catalog.pg_roles r
                                     where r.rolname = current_user))
              order by p.oid desc loop
        begin
            execute format('drop function %s', f);
        exception when dependent_objects_still_exist then
            raise exception using errcode = 'PR006',
                message = format('%s is gone from this pgrag release, but %s', f, sqlerrm),
                hint = 'drop or change what depends on it (its DETAIL names it), then migrate again';
        end;
    end loop;
end
$$;
