-- Undo 0004 exactly: the functions of idempotent/30_search.sql, then the table.
drop function if exists pgrag.search(vector, integer, jsonb, text[], integer, integer);
drop function if exists pgrag.hybrid_search(text, vector, integer, jsonb, text[], text, integer, integer, integer, integer);
drop function if exists pgrag.text_search(text, integer, jsonb, text[], text);
drop function if exists pgrag.stats(jsonb, text[]);
drop function if exists pgrag.context(bigint, integer);
drop function if exists pgrag.declare_stats(text, text);
drop function if exists pgrag.stats_statement(text, text, boolean);
drop function if exists pgrag.doc_type_stats(text, bigint[]);
drop function if exists pgrag.run_search(text, text, vector, integer, jsonb, text[], text, integer, integer, integer, integer, integer);
drop function if exists pgrag.text_query(text, text);
drop function if exists pgrag.search_tsquery(text, text, text[]);
drop function if exists pgrag.common_lexemes(real, bigint);
drop function if exists pgrag.stats_common_lexemes(real, bigint);
drop function if exists pgrag.estimate_rows(text);
drop function if exists pgrag.filter_index_keys();
drop table pgrag.doc_stats;
