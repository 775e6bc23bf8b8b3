-- Before the idempotent files run (pgrag/migrate.py): remember every function of schema pgrag
-- and the version of its catalog row. CREATE OR REPLACE writes a new row version, so a
-- function whose version is unchanged afterwards is one no idempotent file defines any more.
create temporary table pgrag_migration_functions on commit drop as
select p.oid, p.xmin::text as version
  from pg_catalog.pg_proc p
 where p.pronamespace = (select n.oid from pg_catalog.pg_namespace n where n.nspname = 'pgrag');
