-- Undo 0004 exactly (after idempotent.sql removed the functions).
drop table pgrag.doc_stats;
