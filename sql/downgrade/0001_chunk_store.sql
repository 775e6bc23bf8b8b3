-- Undo 0001 exactly: the schema and everything in it, and the vector extension
-- only if 0001 created it.
do $$
declare
    drop_vector boolean;
begin
    select created_vector_extension into drop_vector from pgrag.settings;
    drop schema pgrag cascade;
    if drop_vector then
        drop extension if exists vector;
    end if;
end
$$;
