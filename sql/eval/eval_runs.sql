-- Storing and listing evaluation runs (pgrag.eval.runner.store_run, list_runs; table
-- pgrag.eval_runs from sql/incremental/0005_eval_runs.sql).
--
-- One statement per "-- name: X" section, run with bound parameters only. No literal percent
-- signs: psycopg reads them as placeholders.

-- name: insert_run
insert into pgrag.eval_runs (question_set, question_set_sha256, strategy, k, questions,
                             embedding_model, pgrag_version, metrics, by_label, per_query,
                             faithfulness, latency_ms, notes)
values (%(question_set)s, %(question_set_sha256)s, %(strategy)s, %(k)s, %(questions)s,
        %(embedding_model)s, %(pgrag_version)s, %(metrics)s, %(by_label)s, %(per_query)s,
        %(faithfulness)s, %(latency_ms)s, %(notes)s)
returning id, created_at;

-- name: list_runs
select r.id, r.created_at, r.question_set, r.question_set_sha256, r.strategy, r.k, r.questions,
       r.embedding_model, r.pgrag_version, r.metrics, r.faithfulness, r.latency_ms, r.notes
from pgrag.eval_runs r
where (%(question_set)s::text is null or r.question_set = %(question_set)s::text)
  and (%(strategy)s::text is null or r.strategy = %(strategy)s::text)
order by r.created_at desc, r.id desc
limit %(lim)s;

-- name: chunk_counts
select c.doc_type, count(*)::bigint as chunks,
       count(*) filter (where c.embedding is null)::bigint as waiting
from pgrag.chunks c
group by c.doc_type;

-- name: embedding_model
select s.embedding_model from pgrag.settings s;

-- name: waiting_chunks
select c.id, c.text, c.content_hash
from pgrag.chunks c
where c.doc_type = %(doc_type)s and c.embedding is null
order by c.id;

-- name: store_embeddings
select count(*) from pgrag.store_embeddings(%(model)s, %(ids)s::bigint[], %(hashes)s::bytea[],
                                            %(vectors)s::vector[]);

-- name: check_embedder
select pgrag.check_embedder(%(model)s, %(dim)s);
