-- Regenerate every declared type's generated functions (10_documents_int.sql) against this
-- version of pgrag, so that an upgrade reaches the types declared before it. Last: it calls the
-- functions of every file above.
do $$
declare
    t record;
    w record;
begin
    for t in select d.name from pgrag.doc_types d
              where exists (select 1 from pg_class c where c.oid = d.source) loop
        perform pgrag._create_render_function(t.name);
    end loop;
    for w in select dw.doc_type, dw.source_table from pgrag.doc_watches dw
              where exists (select 1 from pg_class c where c.oid = dw.source_table) loop
        perform pgrag._create_sync_function(w.doc_type, w.source_table);
    end loop;
end
$$;
