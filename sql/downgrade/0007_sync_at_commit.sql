-- Undo 0007 exactly (after idempotent.sql removed the functions and the commit-time trigger).
drop table pgrag.sync_pending;
drop table pgrag.sync_queue;
