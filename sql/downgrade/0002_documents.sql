-- Undo 0002 (after idempotent.sql removed the triggers and functions): the views pgrag made
-- from the declarations' queries, then the registry. Dropping a view takes its owner.
do $$
declare
    v regclass;
begin
    for v in select d.source from pgrag.doc_types d
              where d.owns_source and exists (select from pg_class c where c.oid = d.source) loop
        execute format('drop view %s', v);
    end loop;
end
$$;
drop table pgrag.doc_watches;
drop table pgrag.doc_types;
drop index pgrag.chunks_parent_key;
alter table pgrag.chunks drop column parent_key;
