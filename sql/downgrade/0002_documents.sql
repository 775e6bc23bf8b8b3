-- Undo 0002: remove the generated triggers and views first, then the registry.
do $$
declare
    t record;
begin
    for t in select name from pgrag.doc_types order by parent_type nulls last loop
        perform pgrag.drop_document(t.name, keep_chunks => true);
    end loop;
end
$$;
drop function if exists pgrag.drop_document(text, boolean);
drop function if exists pgrag.declare_document(text, text, jsonb, text, jsonb);
drop function if exists pgrag.refresh(text, text[]);
drop function if exists pgrag.verify(text);
drop function if exists pgrag.sync_trigger();
drop function if exists pgrag.document_keys(text);
drop function if exists pgrag.create_sync_triggers(text, regclass);
drop function if exists pgrag.create_render_function(text);
drop function if exists pgrag.drop_sync_triggers(text, regclass);
drop table pgrag.doc_watches;
drop table pgrag.doc_types;
drop index pgrag.chunks_parent_key;
alter table pgrag.chunks drop column parent_key;
