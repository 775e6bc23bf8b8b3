-- Undo 0009 exactly (after idempotent.sql removed the functions).
drop type pgrag.search_hit;
