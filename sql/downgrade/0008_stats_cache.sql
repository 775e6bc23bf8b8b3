-- Undo 0008 exactly: the triggers pgrag.sync_stats_triggers put on tables, the functions of
-- idempotent/60_stats_cache.sql, the tables and the column. The revision's downgrade then
-- re-applies the 0007 files, which restore pgrag.doc_type_stats_where without the cache.
do $$
declare
    t regclass;
begin
    for t in select tg.tgrelid::regclass from pg_trigger tg
              where tg.tgname = 'pgrag_stats_changed' loop
        execute format('drop trigger pgrag_stats_changed on %s', t);
    end loop;
end
$$;
drop trigger pgrag_stats_redeclared on pgrag.doc_stats;
-- if exists: added to 60_stats_cache.sql after 0008 was released; a database migrated by that
-- release has it only after an upgrade refreshed the functions
drop function if exists pgrag.doc_type_stats_lookup(text, text);
drop function pgrag.stats_redeclared();
drop function pgrag.stats_changed();
drop function pgrag.cache_stats(text, boolean);
drop function pgrag.sync_stats_triggers(regclass[]);
drop function pgrag.stats_query_tables(text);
drop function pgrag.prune_stats_changes();
drop function pgrag.stats_cache_put(text, bytea, text, jsonb, pg_snapshot, xid8, text);
drop function pgrag.stats_cache_valid(pgrag.stats_cache, regclass[], text);  -- before what it uses
drop function pgrag.stats_triggers_state(regclass[]);
drop function pgrag.stats_chunk_columns();
drop function pgrag.stats_settings_key();
drop function pgrag.stats_database_subscribed();
drop function pgrag.stats_cache_usable();
drop table pgrag.stats_cache_horizon;
drop table pgrag.stats_changes;
drop table pgrag.stats_cache;
alter table pgrag.doc_stats drop column cache_deps;
