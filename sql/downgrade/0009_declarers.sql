-- Undo 0009 exactly (after idempotent.sql removed the functions, those of pgrag_docs too): the
-- views made from declarations' queries go back to schema pgrag, then the columns, the schema
-- and the type. Moving a view takes its owner (or a superuser).
do $$
declare
    v regclass;
begin
    for v in select c.oid::regclass from pg_class c
              where c.relnamespace = 'pgrag_docs'::regnamespace and c.relkind = 'v' loop
        execute format('alter view %s set schema pgrag', v);
    end loop;
end
$$;
drop table pgrag.render_lag;
drop table pgrag.render_errors;
drop table pgrag.render_queue;
alter table pgrag.chunks drop column truncated_from;
alter table pgrag.doc_watches drop column reads;
alter table pgrag.doc_types drop column sync;
alter table pgrag.doc_types drop column vocabulary;
alter table pgrag.settings drop column query_cache_ttl;
alter table pgrag.doc_types disable row level security;
alter table pgrag.doc_watches disable row level security;
alter table pgrag.doc_stats disable row level security;
alter table pgrag.doc_stats drop column owner;
alter table pgrag.doc_types drop column owner;
drop schema pgrag_docs;
drop type pgrag.search_hit;
