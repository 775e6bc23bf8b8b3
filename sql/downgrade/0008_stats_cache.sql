-- Undo 0008 exactly (after idempotent.sql removed the functions and the cache's triggers).
drop table pgrag.stats_cache_horizon;
drop table pgrag.stats_changes;
drop table pgrag.stats_cache;
alter table pgrag.doc_stats drop column cache_deps;
