-- Undo 0007 exactly: the commit-time functions and trigger of idempotent/50_sync_at_commit.sql,
-- each watch's generated key function, then the tables. The revision's downgrade re-applies the
-- 0006 files, which regenerate every sync trigger function rendering per statement again.
drop trigger pgrag_sync_at_commit on pgrag.sync_pending;
do $$
declare
    p regprocedure;
begin
    for p in select pr.oid::regprocedure from pg_proc pr
              where pr.pronamespace = 'pgrag'::regnamespace
                and (pr.proname in ('sync_now', 'sync_at_commit', 'lock_documents')
                     or pr.proname ~ '^keys_[a-z][a-z0-9_]*_[0-9a-f]{10}$')
    loop
        execute format('drop function %s', p);
    end loop;
end
$$;
drop table pgrag.sync_pending;
drop table pgrag.sync_queue;
