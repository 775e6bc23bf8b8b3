-- Undo 0003 exactly: the functions of idempotent/20_embeddings.sql, then the tables.
drop function if exists pgrag.chunk_lock_keys(bigint);
drop function if exists pgrag.claim_chunks(text, integer, integer);
drop function if exists pgrag.release_chunks(bigint[]);
drop function if exists pgrag.store_embeddings(text, bigint[], bytea[], vector[]);
drop function if exists pgrag.record_embed_failures(text, bigint[], bytea[], text, interval);
drop function if exists pgrag.clear_embed_errors();
drop function if exists pgrag.embed_queue(text, integer);
drop function if exists pgrag.check_embedder(text, integer);
drop function if exists pgrag.begin_reembed(text, integer);
drop function if exists pgrag.query_cache_get(text, bytea, interval);
drop function if exists pgrag.query_cache_put(text, bytea, text, vector, interval);
drop function if exists pgrag.prune_embedding_cache();
drop table pgrag.embed_errors;
drop table pgrag.query_cache;
drop table pgrag.embedding_cache;
