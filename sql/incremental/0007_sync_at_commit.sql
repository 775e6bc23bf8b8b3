-- 0007: sync at commit: the queue of documents to render when the writer's transaction commits.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- A watched table's statement trigger no longer renders (by default): it queues the document
-- keys its key query found, with the statement's changed rows, and inserts this transaction's
-- marker; a deferred constraint trigger on the marker (sql/idempotent/50_sync_at_commit.sql)
-- renders every queued document at commit, taking all document locks in one order.
-- docs/reliability.md explains why (deadlocks between document locks and row locks).
--
-- Both tables are empty at rest: their rows are inserted and deleted by the same transaction,
-- so no other session ever sees one. UNLOGGED: nothing in them must survive a crash (a crash
-- aborts every transaction that could have rows there), and they cost no WAL.

create unlogged table pgrag.sync_queue (
    xid xid8 not null default pg_current_xact_id(),
    seq bigint generated always as identity,
    doc_type text not null,
    source_table regclass not null,
    op text not null,
    keys text[],   -- the keys the statement's key query found; NULL: all (TRUNCATE)
    changed text,  -- the statement's old and new rows, as source_table's row type array text
    primary key (xid, seq)
);

comment on table pgrag.sync_queue is
    'Documents a transaction changed, rendered at its commit (empty at rest: docs/documents.md)';

-- One row per transaction that queued something: its insert schedules the commit-time render.
create unlogged table pgrag.sync_pending (
    xid xid8 primary key default pg_current_xact_id()
);

comment on table pgrag.sync_pending is
    'One marker per transaction with queued documents; its deferred trigger renders them at commit';
