-- The chunk store's shape, when `pgrag db upgrade --tenant-partitions` (alembic: -x
-- tenant_partitions=...) asks for one: run by pgrag/migrate.py at head, in the migration's
-- transaction, before the idempotent files (which then make the functions, policies, grants and
-- triggers of pgrag.chunks for the new table). docs/scaling.md, "Partitioned chunk stores".
--
--   (unset, '')  keep the store as it is
--   none         one table (the default store)
--   list         partitioned by list (tenant): a partition per tenant in the store, one for the
--                shared chunks (tenant NULL), a default one for tenants that arrive later
--                (run it again to give them their own)
--   N (2-256)    partitioned by hash (tenant) into N partitions
--
-- A conversion copies every chunk (ids, vectors and all) into a new table, builds the store's
-- indexes on it (each partition its own HNSW graph, with the old index's parameters), drops the
-- old table and takes its name, holding an ACCESS EXCLUSIVE lock on the store throughout: no
-- search or render runs meanwhile, nothing is lost if it fails (one transaction).
--
-- What a partitioned table cannot have, and what stands in for it: PostgreSQL requires a
-- partitioned table's unique constraints to contain the partition key, so the store's
-- (doc_type, source_key) becomes (doc_type, source_key, tenant) (a document is still stored
-- once: its render holds the document's lock, and an UPDATE moves a chunk whose tenant changed
-- to its new partition; `pgrag verify` reports a document stored twice); the primary key on id
-- becomes a plain index (ids come from one identity sequence); the foreign keys to id
-- (chunks.parent_id, embed_errors.chunk_id, both ON DELETE CASCADE) become the statement
-- trigger pgrag_chunks_cascade (10_documents_int.sql).
do $shape$
declare
    want text := coalesce(current_setting('pgrag.tenant_partitions', true), '');
    store constant regclass := to_regclass('pgrag.chunks');
    old_oid oid;
    parted boolean;
    strategy "char";
    parts integer;
    settled boolean;
    tenants text[];  -- list: the tenants the store holds, each one's partition
    cols text;
    defs text[];
    notes text[];
    foreign_deps text;
    acl aclitem[];
    options text[];
    forced boolean;
    identity "char";
    targets jsonb;
    column_options jsonb;
    detail text;
    next_id bigint;
    owner_role regrole;
    comment text;
    r record;
    i integer;
begin
    if want = '' or store is null then
        return;
    end if;
    if want !~ '^(none|list|[0-9]{1,4})$'
       or (want ~ '^[0-9]+$' and want::integer not between 2 and 256) then
        raise exception using errcode = 'PR006',
            message = format('tenant partitions %L is not none, list or a number from 2 to 256',
                             want),
            hint = 'pass --tenant-partitions list (a partition per tenant), N (hash into N) or '
                   'none (one table)';
    end if;
    old_oid := store;
    select c.relkind = 'p', c.relowner::regrole into strict parted, owner_role
      from pg_class c where c.oid = store;
    select p.partstrat into strategy from pg_partitioned_table p where p.partrelid = store;
    select count(*) into parts from pg_inherits h where h.inhparent = store;
    -- Already in that shape: nothing to do (list: unless tenants wait in the default partition).
    if (want = 'none' and not parted)
       or (want ~ '^[0-9]+$' and strategy = 'h' and parts = want::integer) then
        return;
    end if;
    if want = 'list' and strategy = 'l' then
        execute 'select not exists (select from pgrag.chunks_default)' into settled;
        if settled then
            return;
        end if;
    end if;
    if to_regclass('pgrag.chunks_embedding_hnsw_new') is not null then
        -- a store index rebuild left unfinished (pgrag/filter_index.py): copied as it is, it
        -- would be a second graph built per partition, or the only one under another name
        raise exception using errcode = 'PR006',
            message = 'a rebuild of the store index is unfinished (pgrag.chunks_embedding_hnsw_new '
                      'is there): the store is not converted',
            hint = 'run `pgrag reindex` (it swaps a built new index in, or builds it again), '
                   'then convert';
    end if;
    if not pg_has_role(owner_role, 'USAGE') then
        raise exception using errcode = 'PR006',
            message = format('%I does not own pgrag.chunks (%s does): it cannot convert the store',
                             current_user, owner_role),
            hint = format('migrate as %s (or a member of it)', owner_role);
    end if;
    lock table pgrag.chunks, pgrag.embed_errors in access exclusive mode;
    -- Every read below sees every row: FORCE ROW LEVEL SECURITY would filter the owner's own
    -- (it is set again on the new table), and row_security off makes any policy that still
    -- applied an error instead of a silent filter, until the copy is made.
    select c.relforcerowsecurity into strict forced from pg_class c where c.oid = store;
    alter table pgrag.chunks no force row level security;
    set local row_security = off;
    if want = 'list' then
        select coalesce(array_agg(distinct c.tenant order by c.tenant)
                            filter (where c.tenant is not null), '{}')
          into strict tenants from pgrag.chunks c;
    end if;
    if cardinality(tenants) > 254 then  -- (with the shared and the default partitions)
        raise exception using errcode = 'PR006',
            message = format('the store holds %s tenants: a partition each would be more than '
                             '256 partitions', cardinality(tenants)),
            hint = 'partition by hash instead: --tenant-partitions 64 (every search over all '
                   'tenants locks each partition and its indexes: docs/scaling.md)';
    end if;

    -- What the drop of the old table would take with it and the copy would not make again:
    -- another role's views, functions, foreign keys, triggers, policies, publications,
    -- constraints, column grants. Refused, each named: converting would destroy them.
    select string_agg(what, '; ' order by what) into foreign_deps from (
        select distinct pg_describe_object(d.classid, d.objid, d.objsubid) as what
          from pg_depend d
         where d.refclassid = 'pg_class'::regclass and d.refobjid = store
           and d.deptype in ('n', 'a')
           and d.classid not in ('pg_class'::regclass,      -- indexes, partitions: made again
                                 'pg_attrdef'::regclass)    -- defaults: copied
           and not (d.classid = 'pg_proc'::regclass          -- pgrag's own: made again
                    and exists (select from pg_proc p where p.oid = d.objid
                                 and p.pronamespace = 'pgrag'::regnamespace))
           and not (d.classid = 'pg_policy'::regclass
                    and exists (select from pg_policy p where p.oid = d.objid
                                 and p.polname in ('chunks_read', 'chunks_write')))
           and not (d.classid = 'pg_trigger'::regclass
                    and exists (select from pg_trigger t where t.oid = d.objid
                                 and (t.tgisinternal
                                      or t.tgfoid in (to_regproc('pgrag.stats_changed'),
                                                      to_regproc('pgrag._chunks_deleted')))))
           and not (d.classid = 'pg_constraint'::regclass
                    and exists (select from pg_constraint k where k.oid = d.objid
                                 and (k.conrelid = store and k.contype in ('c', 'n')  -- copied
                                      or (k.conrelid = store
                                          and k.conname in ('chunks_pkey',
                                                       'chunks_doc_type_source_key_key',
                                                       'chunks_doc_type_source_key_tenant_key',
                                                       'chunks_parent_id_fkey'))
                                      or (k.conrelid = 'pgrag.embed_errors'::regclass
                                          and k.conname = 'embed_errors_chunk_id_fkey'))))
        union all
        select format('a grant on column %I', a.attname)
          from pg_attribute a where a.attrelid = store and a.attacl is not null
        union all
        select 'replica identity using an index'
          from pg_class c where c.oid = store and c.relreplident = 'i'
    ) x;
    if foreign_deps is not null then
        raise exception using errcode = 'PR006',
            message = format('converting pgrag.chunks would drop what depends on it: %s',
                             foreign_deps),
            hint = 'drop them first (and make them again after the conversion), or keep the '
                   'store as it is';
    end if;
    -- What the new table carries over: grants, row-level security FORCE (read above),
    -- storage and column options, statistics targets, replica identity.
    select c.relacl, c.reloptions, c.relreplident into strict acl, options, identity
      from pg_class c where c.oid = store;
    select jsonb_object_agg(a.attname, a.attstattarget) into targets
      from pg_attribute a
     where a.attrelid = store and a.attnum > 0 and not a.attisdropped
       and a.attstattarget is not null and a.attstattarget >= 0;
    select jsonb_object_agg(a.attname, array_to_string(a.attoptions, ', ')) into column_options
      from pg_attribute a
     where a.attrelid = store and a.attnum > 0 and not a.attisdropped
       and a.attoptions is not null;

    raise notice 'pgrag: converting the chunk store (% chunks) to tenant partitions: % (%)',
        (select count(*) from pgrag.chunks), want, clock_timestamp()::time(0);

    -- What the new table takes from the old: its columns (all but the generated ones are
    -- copied), its indexes (not those of its constraints, made below for the new shape), the
    -- next id, its comment.
    select string_agg(quote_ident(a.attname), ', ' order by a.attnum) into strict cols
      from pg_attribute a
     where a.attrelid = store and a.attnum > 0 and not a.attisdropped and a.attgenerated = '';
    -- (a filter index's comment is its filter: searches find it by it; an invalid index, a
    -- build that died or one a partitioned store's add left half built, is not carried over:
    -- it goes with the old table, and the next add of its filter builds it afresh)
    select coalesce(array_agg(replace(pg_get_indexdef(x.indexrelid), ' ON ONLY ', ' ON ')
                              order by x.indexrelid), '{}'),
           coalesce(array_agg(format('comment on index pgrag.%I is %L', ic.relname,
                                     obj_description(x.indexrelid, 'pg_class'))
                              order by x.indexrelid), '{}')
      into strict defs, notes
      from pg_index x join pg_class ic on ic.oid = x.indexrelid
     where x.indrelid = store and x.indisvalid
       and not exists (select from pg_constraint k where k.conindid = x.indexrelid);
    -- (the sequence's own state: pg_sequence_last_value is NULL until it is used after a
    -- restart)
    execute format('select case when s.is_called then s.last_value + 1 else s.last_value end '
                   'from %s s', pg_get_serial_sequence('pgrag.chunks', 'id')) into next_id;
    next_id := greatest(next_id, coalesce((select max(c.id) from pgrag.chunks c), 0) + 1);
    comment := obj_description(store, 'pg_class');

    execute format('create table pgrag.chunks_converted (like pgrag.chunks including defaults '
                   'including generated including identity including constraints '
                   'including storage including compression including comments) %s',
                   case want when 'none' then ''
                             when 'list' then 'partition by list (tenant)'
                             else 'partition by hash (tenant)' end);
    execute format('alter table pgrag.chunks_converted alter column id restart with %s', next_id);
    if want = 'list' then
        create table pgrag.chunks_converted_shared partition of pgrag.chunks_converted
            for values in (null);
        comment on table pgrag.chunks_converted_shared is
            'pgrag.chunks'' partition of the shared chunks (tenant NULL)';
        for i in 1 .. cardinality(tenants) loop
            execute format('create table pgrag.%I partition of pgrag.chunks_converted '
                           'for values in (%L)', 'chunks_converted_t' || i, tenants[i]);
            execute format('comment on table pgrag.%I is %L', 'chunks_converted_t' || i,
                           'pgrag.chunks'' partition of one tenant');
        end loop;
        create table pgrag.chunks_converted_default partition of pgrag.chunks_converted default;
        comment on table pgrag.chunks_converted_default is
            'pgrag.chunks'' partition of the tenants that arrived after the last conversion '
            '(`pgrag db upgrade --tenant-partitions list` gives each its own)';
    elsif want <> 'none' then
        for i in 0 .. want::integer - 1 loop
            execute format('create table pgrag.%I partition of pgrag.chunks_converted '
                           'for values with (modulus %s, remainder %s)',
                           'chunks_converted_p' || i, want, i);
            execute format('comment on table pgrag.%I is %L', 'chunks_converted_p' || i,
                           format('pgrag.chunks'' partition %s of %s (hash of the tenant)',
                                  i, want));
        end loop;
    end if;

    raise notice 'pgrag: copying the chunks (%)', clock_timestamp()::time(0);
    execute format('insert into pgrag.chunks_converted (%s) overriding system value '
                   'select %s from pgrag.chunks', cols, cols);
    set local row_security = on;

    -- The old table goes, and with it what depends on it: its policies and triggers, the
    -- foreign key of pgrag.embed_errors, the SQL-bodied functions that read it (the idempotent
    -- files, applied next, make them all again for the new table).
    -- Not CASCADE: pgrag's own dependents go by name first (the SQL-bodied functions of
    -- schema pgrag that read it, made again by the idempotent files; embed_errors' foreign key)
    -- and the table takes its policies, triggers and indexes with it; anything else that still
    -- depends on it, which the check above does not see (a column of its row type, a default
    -- on its sequence, a view of a partition, a view calling one of those functions), stops
    -- the conversion, named.
    alter table pgrag.embed_errors drop constraint if exists embed_errors_chunk_id_fkey;
    for r in select distinct d.objid::regprocedure as fn
               from pg_depend d join pg_proc p on p.oid = d.objid
              where d.classid = 'pg_proc'::regclass and d.refclassid = 'pg_class'::regclass
                and d.refobjid = store and p.pronamespace = 'pgrag'::regnamespace loop
        execute format('drop function %s', r.fn);
    end loop;
    begin
        drop table pgrag.chunks;
    exception when dependent_objects_still_exist then
        get stacked diagnostics detail = pg_exception_detail;
        raise exception using errcode = 'PR006',
            message = format('converting pgrag.chunks would drop what depends on it: %s',
                             replace(detail, E'\n', '; ')),
            hint = 'drop them first (and make them again after the conversion), or keep the '
                   'store as it is';
    end;
    alter table pgrag.chunks_converted rename to chunks;
    alter sequence pgrag.chunks_converted_id_seq rename to chunks_id_seq;
    for r in select c.oid::regclass as rel, c.relname from pg_inherits h
               join pg_class c on c.oid = h.inhrelid
              where h.inhparent = 'pgrag.chunks'::regclass loop
        execute format('alter table %s rename to %I', r.rel,
                       'chunks_' || substr(r.relname, length('chunks_converted_') + 1));
        execute format('alter table %s owner to %s', r.rel, owner_role);
    end loop;
    execute format('alter table pgrag.chunks owner to %s', owner_role);
    execute format('comment on table pgrag.chunks is %L', comment);

    if want = 'none' then
        -- (a partitioned store's parent_id is kept by a trigger, not a foreign key: a parent
        -- deleted while a render linked a child to it leaves the link dangling)
        update pgrag.chunks c set parent_id = null
         where c.parent_id is not null
           and not exists (select from pgrag.chunks p where p.id = c.parent_id);
        alter table pgrag.chunks add constraint chunks_pkey primary key (id);
        alter table pgrag.chunks add constraint chunks_doc_type_source_key_key
            unique (doc_type, source_key);
        alter table pgrag.chunks add constraint chunks_parent_id_fkey
            foreign key (parent_id) references pgrag.chunks (id) on delete cascade;
        delete from pgrag.embed_errors e
         where not exists (select from pgrag.chunks c where c.id = e.chunk_id);
        alter table pgrag.embed_errors add constraint embed_errors_chunk_id_fkey
            foreign key (chunk_id) references pgrag.chunks (id) on delete cascade;
    else
        alter table pgrag.chunks add constraint chunks_doc_type_source_key_tenant_key
            unique nulls not distinct (doc_type, source_key, tenant);
        -- Each partition's ids are unique by an index of its own (the partitioned table may
        -- have none: its unique keys must hold the tenant), which is also the partition's
        -- replica identity: a publication of its updates needs one, and FULL would take in
        -- the generated columns, which PostgreSQL 18 refuses to identify rows by.
        for r in select h.inhrelid::regclass as rel, c.relname from pg_inherits h
                   join pg_class c on c.oid = h.inhrelid
                  where h.inhparent = 'pgrag.chunks'::regclass loop
            execute format('create unique index %I on %s (id)', r.relname || '_id', r.rel);
            execute format('alter table %s replica identity using index %I', r.rel,
                           r.relname || '_id');
        end loop;
    end if;
    for i in 1 .. cardinality(defs) loop
        raise notice 'pgrag: % (%)', defs[i], clock_timestamp()::time(0);
        execute defs[i];
        execute notes[i];
    end loop;
    alter table pgrag.chunks enable row level security;
    if forced then
        alter table pgrag.chunks force row level security;
    end if;
    for r in select g.privilege_type, g.grantee, g.is_grantable
               from aclexplode(acl) g where g.grantee <> owner_role loop
        execute format('grant %s on pgrag.chunks to %s%s', r.privilege_type,
                       case r.grantee when 0 then 'public' else r.grantee::regrole::text end,
                       case when r.is_grantable then ' with grant option' else '' end);
    end loop;
    if want = 'none' and identity in ('f', 'n') then
        execute format('alter table pgrag.chunks replica identity %s',
                       case identity when 'f' then 'full' else 'nothing' end);
    end if;
    for r in select key, value from jsonb_each_text(column_options) loop
        execute format('alter table pgrag.chunks alter column %I set (%s)', r.key, r.value);
    end loop;
    for r in select key, value::integer as target from jsonb_each_text(targets) loop
        execute format('alter table pgrag.chunks alter column %I set statistics %s',
                       r.key, r.target);
    end loop;
    if options is not null then  -- (a partitioned table takes none: its partitions do)
        for r in select c.oid::regclass as rel from pg_class c
                  where c.oid = 'pgrag.chunks'::regclass and c.relkind = 'r'
                 union all
                 select h.inhrelid::regclass from pg_inherits h
                  where h.inhparent = 'pgrag.chunks'::regclass loop
            execute format('alter table %s set (%s)', r.rel, array_to_string(options, ', '));
        end loop;
    end if;

    -- The statistics cache names the tables a cached type reads by oid.
    update pgrag.doc_stats s set cache_deps = array_replace(s.cache_deps, old_oid::regclass,
                                                            'pgrag.chunks'::regclass)
     where old_oid::regclass = any(s.cache_deps);
    delete from pgrag.stats_changes where relid = old_oid;
    delete from pgrag.stats_cache;
    analyze pgrag.chunks;
end
$shape$;
