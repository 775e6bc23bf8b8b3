-- Undo 0003 exactly (after idempotent.sql removed the functions).
drop table pgrag.embed_errors;
drop table pgrag.query_cache;
drop table pgrag.embedding_cache;
