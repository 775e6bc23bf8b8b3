-- Before the idempotent files run (pgrag/migrate.py): remember every function of schema pgrag
-- and the version of its catalog row. CREATE OR REPLACE writes a new row version, so a
-- function whose version is unchanged afterwards is one no idempotent file defines any more.
create temporary table pgrag_migration_functions on commit drop as
select p.oid, p.xmin::text as version
  from pg_catalog.pg_proc p
 where p.pronamespace = (select n.oid from pg_catalog.pg_namespace n where n.nspname = 'pgrag');


-- pgvector's library, loaded in this session: pgrag._search sets hnsw.* in its SET clause, and
-- PostgreSQL refuses a setting of a library not yet loaded (a placeholder) to a non-superuser.
-- The first migration loaded it by creating the store; an upgrade run again, in a fresh
-- session, failed for every role but a superuser. A value of pgvector's type loads it.
do $$
begin
    execute format('select %L::%I.vector', '[1]',
                   (select n.nspname from pg_catalog.pg_extension e
                      join pg_catalog.pg_namespace n on n.oid = e.extnamespace
                     where e.extname = 'vector'));
end
$$;
