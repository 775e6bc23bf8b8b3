-- Undo 0002: remove the generated triggers and views first, then the registry.
do $$
declare
    t record;
begin
    -- children before parents, however deep
    for t in with recursive depth(name, level) as (
                 select d.name, 0 from pgrag.doc_types d where d.parent_type is null
                 union all
                 select d.name, depth.level + 1
                 from pgrag.doc_types d join depth on d.parent_type = depth.name)
             select name from depth order by level desc, name loop
        perform pgrag.drop_document(t.name, keep_chunks => true);
    end loop;
end
$$;
drop function if exists pgrag.drop_document(text, boolean);
drop function if exists pgrag.declare_document(text, text, jsonb, text, jsonb);
drop function if exists pgrag.declare_document(text, text, jsonb, text, jsonb, text, jsonb);
drop function if exists pgrag.refresh(text, text[]);
drop function if exists pgrag.verify(text);
drop function if exists pgrag.run_sync(text, text[], text, regclass);
drop function if exists pgrag.sync_function_name(text, regclass);
drop function if exists pgrag.create_sync_function(text, regclass);
drop function if exists pgrag.document_keys(text);
drop function if exists pgrag.create_sync_triggers(text, regclass);
drop function if exists pgrag.create_render_function(text);
drop function if exists pgrag.drop_sync_triggers(text, regclass);
drop function if exists pgrag.check_one_statement(text);
drop function if exists pgrag.pin_output_settings(text);
drop table pgrag.doc_watches;
drop table pgrag.doc_types;
drop index pgrag.chunks_parent_key;
alter table pgrag.chunks drop column parent_key;
