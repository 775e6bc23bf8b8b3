-- Undo 0010 exactly (after idempotent.sql removed the functions).
drop table pgrag.tuning;
alter table pgrag.doc_stats drop column if exists query_tables;
alter table pgrag.settings drop column ef_search;
alter table pgrag.sync_queue alter column changed set storage extended;
