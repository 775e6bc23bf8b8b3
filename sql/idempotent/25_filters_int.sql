-- The metadata filter language, compiled to one boolean SQL expression over the chunks (alias c),
-- with every key and value a quoted literal: the one compiler of the search statement, the
-- statistics, the SQL API and the filter indexes (docs/filters-and-answers.md).
--
-- A filter is a JSON object over the metadata keys of the document types searched (their
-- declared schema: key -> text, integer, numeric, boolean, date, text[], integer[]), plus
-- doc_type:
--     {"segment": "VIP", "has_returns": true}
--     {"order_date": {"$gte": "2024-01-01", "$lt": "2024-02-01"}, "status": {"$ne": "delivered"}}
--     {"categories": {"$contains": "Books"}, "$or": [{"total": {"$gt": 100}}, {"segment": "VIP"}]}
--
-- SQL shape (measured with EXPLAIN, docs/filters-and-answers.md):
--   * equality and array containment of one object level are merged into a single
--     c.metadata @> '{...}'::jsonb, which the gin (metadata jsonb_path_ops) index serves; a key
--     of a filter index (split_keys) gets an @> of its own;
--   * $in is c.metadata @> any('{...}'::jsonb[]) (one index search per value);
--   * ranges of one object level are merged into a single c.metadata @? '$ ? (...)'::jsonpath
--     (a filter index's key: one of its own). A range is two-valued: a missing key or a stored
--     value of another type is false, never NULL and never a cast error;
--   * $ne, $nin and $not are not (...) of the above (true when the key is missing).
-- Keys and values reach the SQL only inside quoted jsonb / jsonpath / text literals (%L), never
-- as SQL text. Errors: SQLSTATE PR005 (InvalidFilter), one line naming what is valid.
--
-- Its limits are pgrag._limit's filter_* (00_core_int.sql).

create or replace function pgrag._filter_invalid(message text)
returns void
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    raise exception using errcode = 'PR005', message = message,
        hint = 'docs/filters-and-answers.md describes the filter language';
end
$$;


create or replace function pgrag._json_show(v jsonb)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- A JSON value as an error message quotes it: its text, cut to 60 characters.
return case when length(v::text) <= 60 then v::text else left(v::text, 57) || '...' end;


create or replace function pgrag._json_kind(v jsonb)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
return case jsonb_typeof(v) when 'null' then 'null' when 'boolean' then 'a boolean'
                            when 'number' then 'a number' when 'string' then 'a string'
                            when 'array' then 'an array' when 'object' then 'an object'
                            else 'null' end;


create or replace function pgrag._filter_example(type_name text)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
return case type_name when 'text' then '"VIP"' when 'integer' then '3'
                      when 'numeric' then '99.5' when 'boolean' then 'true'
                      when 'date' then '"2024-01-31"'
                      when 'text[]' then '"Books" (or a list, ["Books", "Toys"])'
                      when 'integer[]' then '42 (or a list, [42, 43])' end;


create or replace function pgrag._filter_operators(type_name text)
returns text[]
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The operators valid on a metadata key of type_name.
return case when type_name like '%[]' then array['$eq', '$contains', '$ne', '$in', '$nin']
            when type_name in ('integer', 'numeric', 'date')
                then array['$eq', '$ne', '$in', '$nin', '$gt', '$gte', '$lt', '$lte']
            else array['$eq', '$ne', '$in', '$nin'] end;


create or replace function pgrag._filter_value(key text, type_name text, v jsonb,
                                               element_type text default null)
returns jsonb
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- v as the JSON value stored for a key of type_name (element_type: of an array key's element),
-- or PR005 naming what is expected. Integral numbers of an integer key become integers.
declare
    want text := coalesce(element_type, type_name);
    ok boolean;
begin
    ok := case want
        when 'text' then jsonb_typeof(v) = 'string'
        when 'boolean' then jsonb_typeof(v) = 'boolean'
        when 'integer' then jsonb_typeof(v) = 'number'
                            and (v #>> '{}')::numeric = trunc((v #>> '{}')::numeric)
        when 'numeric' then jsonb_typeof(v) = 'number'
        when 'date' then jsonb_typeof(v) = 'string' and (v #>> '{}') ~ '^\d{4}-\d{2}-\d{2}$'
        else false end;
    if ok and want = 'date' then
        begin
            ok := to_char((v #>> '{}')::date, 'YYYY-MM-DD') = v #>> '{}';
        exception when others then
            ok := false;
        end;
    end if;
    if not ok then
        perform pgrag._filter_invalid(format(
            'filter key %L expects %s, got %s %s: write e.g. {"%s": %s}%s',
            key,
            case when element_type is not null
                 then format('%s elements (%s)', type_name, element_type) else type_name end,
            pgrag._json_kind(v), pgrag._json_show(v), key, pgrag._filter_example(type_name),
            case when want = 'date' then ' (dates are ''YYYY-MM-DD'')' else '' end));
    end if;
    if want = 'integer' then
        return to_jsonb(trunc((v #>> '{}')::numeric));
    end if;
    return v;
end
$$;


create or replace function pgrag._filter_canonical(v jsonb)
returns jsonb
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- One JSON form per value, for a filter index's key: integral numbers as integers, arrays
-- sorted without repeats (containment ignores order and repeats; jsonb keeps a number's scale).
begin
    if jsonb_typeof(v) = 'number' and (v #>> '{}')::numeric = trunc((v #>> '{}')::numeric) then
        return to_jsonb(trunc((v #>> '{}')::numeric));
    elsif jsonb_typeof(v) = 'array' then
        return (select coalesce(jsonb_agg(x order by x), '[]'::jsonb)
                  from (select distinct pgrag._filter_canonical(e) as x
                          from jsonb_array_elements(v) e) d);
    end if;
    return v;
end
$$;


create or replace function pgrag._filter_in_list(key text, op text, operand jsonb)
returns jsonb
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if jsonb_typeof(operand) is distinct from 'array' then
        perform pgrag._filter_invalid(format(
            '%s on filter key %L takes an array of values, not %s (%s): write e.g. {"%s": ["a", "b"]}',
            op, key, pgrag._json_kind(operand), pgrag._json_show(operand), op));
    end if;
    if jsonb_array_length(operand) > pgrag._limit('filter_in_values') then
        perform pgrag._filter_invalid(format(
            '%s on filter key %L has %s values: keep it to %s or fewer, or filter on a broader key',
            op, key, to_char(jsonb_array_length(operand), 'FM999,999,999'),
            to_char(pgrag._limit('filter_in_values'), 'FM999,999,999')));
    end if;
    return operand;
end
$$;


create or replace function pgrag._filter_any_of(key text, vals jsonb, negate boolean, md text)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- Key's value is one of vals (a JSON array of stored values): one containment per value.
return case
    when jsonb_array_length(vals) = 0 then case when negate then 'true' else 'false' end
    else format(case when negate then '(not %s)' else '%s' end,
                case when jsonb_array_length(vals) = 1
                     then format('%s @> %L::jsonb', md, jsonb_build_object(key, vals -> 0))
                     else format('%s @> any(%L::jsonb[])', md,
                                 (select array_agg(jsonb_build_object(key, e)::text order by n)
                                    from jsonb_array_elements(vals) with ordinality x(e, n)))
                end) end;


create or replace function pgrag._filter_object(
    node jsonb, schema jsonb, split_keys text[], depth integer, place text, alias text,
    inout terms integer, out expr text)
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- One object level of a filter: its keys' conditions joined by `and`. terms counts conditions
-- across the whole filter. Equalities of this level merge into one containment and ranges into
-- one jsonpath, except the keys in split_keys (top level only), which get one each, canonical.
declare
    md text := case when alias = '' then 'metadata' else alias || '.metadata' end;
    dt text := case when alias = '' then 'doc_type' else alias || '.doc_type' end;
    parts text[] := '{}';
    merged jsonb := '{}';            -- containment of the keys not split
    split_contains text[] := '{}';   -- one containment per split key
    ranges text[] := '{}';           -- jsonpath conditions of the keys not split
    split_ranges jsonb := '{}';      -- split key -> its jsonpath conditions
    e record;
    op record;
    type_name text;
    is_split boolean;
    inner_expr text;
    items text[];
    item jsonb;
    v jsonb;
    vals jsonb;
    elements jsonb;
    joiner text;
begin
    if depth > pgrag._limit('filter_depth') then
        perform pgrag._filter_invalid(format(
            'filter is nested more than %s levels deep: flatten its $and/$or/$not',
            pgrag._limit('filter_depth')));
    end if;
    if jsonb_typeof(node) is distinct from 'object' then
        perform pgrag._filter_invalid(format(
            '%s must be an object, not %s (%s): write e.g. {"segment": "VIP"}',
            place, pgrag._json_kind(node), pgrag._json_show(node)));
    end if;
    for e in select j.key, j.value from jsonb_each(node) j loop
        if e.key in ('$and', '$or') then
            terms := terms + 1;
            if jsonb_typeof(e.value) is distinct from 'array'
               or jsonb_array_length(e.value) = 0 then
                perform pgrag._filter_invalid(format(
                    '%s takes a non-empty array of filter objects, not %s: write e.g. '
                    '{"%s": [{"segment": "VIP"}, {"has_returns": true}]}',
                    e.key, pgrag._json_show(e.value), e.key));
            end if;
            items := '{}';
            for item in select x from jsonb_array_elements(e.value) x loop
                select f.terms, f.expr into terms, inner_expr
                  from pgrag._filter_object(item, schema, '{}', depth + 1,
                                            'each item of ' || e.key, alias, terms) f;
                items := items || inner_expr;
            end loop;
            joiner := case e.key when '$and' then ' and ' else ' or ' end;
            parts := parts || case when cardinality(items) = 1 then items[1]
                                   else '(' || array_to_string(items, joiner) || ')' end;
        elsif e.key = '$not' then
            terms := terms + 1;
            select f.terms, f.expr into terms, inner_expr
              from pgrag._filter_object(e.value, schema, '{}', depth + 1,
                                        'the value of $not', alias, terms) f;
            parts := parts || format('(not %s)', inner_expr);
        elsif e.key = 'doc_type' then
            items := '{}';
            if jsonb_typeof(e.value) = 'object' and e.value = '{}' then
                perform pgrag._filter_invalid(
                    'doc_type has an empty operator object: write {"$eq": "..."}');
            end if;
            for op in select o.key, o.value from jsonb_each(
                          case when jsonb_typeof(e.value) = 'object' then e.value
                               else jsonb_build_object('$eq', e.value) end) o loop
                terms := terms + 1;
                if op.key in ('$eq', '$ne') then
                    if jsonb_typeof(op.value) is distinct from 'string' then
                        perform pgrag._filter_invalid(format(
                            'doc_type expects a document type name (a string, e.g. '
                            '"order_detail"), got %s %s',
                            pgrag._json_kind(op.value), pgrag._json_show(op.value)));
                    end if;
                    items := items || format('%s %s %L', dt,
                                             case op.key when '$eq' then '=' else '<>' end,
                                             op.value #>> '{}');
                elsif op.key in ('$in', '$nin') then
                    vals := pgrag._filter_in_list('doc_type', op.key, op.value);
                    if exists (select from jsonb_array_elements(vals) x
                                where jsonb_typeof(x) <> 'string') then
                        perform pgrag._filter_invalid(format(
                            'doc_type expects a document type name (a string, e.g. '
                            '"order_detail"), got %s',
                            (select pgrag._json_kind(x) || ' ' || pgrag._json_show(x)
                               from jsonb_array_elements(vals) x
                              where jsonb_typeof(x) <> 'string' limit 1)));
                    end if;
                    items := items || format(
                        case op.key when '$in' then '%s = any(%L::text[])'
                                    else '(not %s = any(%L::text[]))' end, dt,
                        array(select x #>> '{}' from jsonb_array_elements(vals) x));
                else
                    perform pgrag._filter_invalid(format(
                        'unknown operator %L for doc_type: valid operators are $eq, $ne, $in, $nin',
                        op.key));
                end if;
            end loop;
            parts := parts || case when cardinality(items) = 1 then items[1]
                                   else '(' || array_to_string(items, ' and ') || ')' end;
        elsif schema ? e.key then
            type_name := schema ->> e.key;
            is_split := depth = 1 and e.key = any(split_keys);
            if jsonb_typeof(e.value) = 'object' and e.value = '{}' then
                perform pgrag._filter_invalid(format(
                    'filter key %L has an empty operator object: give a value or e.g. '
                    '{"$eq": %s}', e.key, pgrag._filter_example(type_name)));
            end if;
            for op in select o.key, o.value from jsonb_each(
                          case when jsonb_typeof(e.value) = 'object' then e.value
                               else jsonb_build_object('$eq', e.value) end) o loop
                terms := terms + 1;
                if op.key <> all(pgrag._filter_operators(type_name)) then
                    perform pgrag._filter_invalid(format(
                        'unknown operator %L for filter key %L (%s): valid operators are %s',
                        op.key, e.key, type_name,
                        array_to_string(pgrag._filter_operators(type_name), ', ')));
                end if;
                if type_name like '%[]' then
                    if op.key in ('$eq', '$contains', '$ne') then
                        elements := case when jsonb_typeof(op.value) = 'array' then op.value
                                         else jsonb_build_array(op.value) end;
                        if jsonb_array_length(elements) = 0 then
                            perform pgrag._filter_invalid(format(
                                'filter key %L %s needs at least one element: e.g. %s',
                                e.key, op.key, pgrag._filter_example(type_name)));
                        end if;
                        elements := (select jsonb_agg(pgrag._filter_value(
                                                 e.key, type_name, x, left(type_name, -2))
                                             order by n)
                                       from jsonb_array_elements(elements)
                                            with ordinality a(x, n));
                        if op.key = '$ne' then
                            parts := parts || format('(not %s @> %L::jsonb)', md,
                                jsonb_build_object(e.key, case when is_split
                                    then pgrag._filter_canonical(elements) else elements end));
                        else
                            -- merged into this level's containment (the split key's too)
                            merged := jsonb_set(merged, array[e.key],
                                coalesce(merged -> e.key, '[]'::jsonb)
                                || (select coalesce(jsonb_agg(x order by n), '[]'::jsonb)
                                      from jsonb_array_elements(elements) with ordinality a(x, n)
                                     where not coalesce(merged -> e.key, '[]'::jsonb) @> jsonb_build_array(x)));
                        end if;
                    else
                        vals := (select coalesce(jsonb_agg(jsonb_build_array(pgrag._filter_value(
                                        e.key, type_name, x, left(type_name, -2))) order by n),
                                        '[]'::jsonb)
                                   from jsonb_array_elements(
                                            pgrag._filter_in_list(e.key, op.key, op.value))
                                        with ordinality a(x, n));
                        if is_split then
                            vals := pgrag._filter_canonical(vals);
                        end if;
                        parts := parts || pgrag._filter_any_of(e.key, vals, op.key = '$nin', md);
                    end if;
                elsif op.key = '$eq' then
                    merged := jsonb_set(merged, array[e.key],
                                        pgrag._filter_value(e.key, type_name, op.value));
                elsif op.key = '$ne' then
                    v := pgrag._filter_value(e.key, type_name, op.value);
                    parts := parts || format('(not %s @> %L::jsonb)', md,
                        jsonb_build_object(e.key, case when is_split
                                                       then pgrag._filter_canonical(v) else v end));
                elsif op.key in ('$in', '$nin') then
                    vals := (select coalesce(jsonb_agg(pgrag._filter_value(e.key, type_name, x)
                                                       order by n), '[]'::jsonb)
                               from jsonb_array_elements(
                                        pgrag._filter_in_list(e.key, op.key, op.value))
                                    with ordinality a(x, n));
                    if is_split then
                        vals := pgrag._filter_canonical(vals);
                    end if;
                    parts := parts || pgrag._filter_any_of(e.key, vals, op.key = '$nin', md);
                else
                    v := pgrag._filter_value(e.key, type_name, op.value);
                    if is_split then
                        v := pgrag._filter_canonical(v);
                    end if;
                    inner_expr := format('@.%s %s %s', to_jsonb(e.key)::text,
                                         case op.key when '$gt' then '>' when '$gte' then '>='
                                                     when '$lt' then '<' else '<=' end,
                                         v::text);
                    if is_split then
                        split_ranges := jsonb_set(split_ranges, array[e.key],
                            coalesce(split_ranges -> e.key, '[]'::jsonb) || to_jsonb(inner_expr));
                    else
                        ranges := ranges || inner_expr;
                    end if;
                end if;
            end loop;
        elsif left(e.key, 1) = '$' then
            perform pgrag._filter_invalid(format(
                'unknown operator %L at the level of keys: use $and, $or or $not here, and '
                'comparison operators inside a key, e.g. {"total": {"$gt": 100}}', e.key));
        else
            perform pgrag._filter_invalid(format(
                'unknown filter key %L: valid keys are %s', e.key,
                array_to_string(array['doc_type']
                                || array(select k from jsonb_object_keys(schema) k order by k)
                                || array['$and', '$or', '$not'], ', ')));
        end if;
        if terms > pgrag._limit('filter_terms') then
            perform pgrag._filter_invalid(format(
                'filter has more than %s conditions: simplify it, or use $in lists (up to %s '
                'values) instead of many alternatives', pgrag._limit('filter_terms'),
                to_char(pgrag._limit('filter_in_values'), 'FM999,999,999')));
        end if;
    end loop;
    -- A filter index's key gets its own condition, in one canonical form: the planner uses a
    -- partial index only when the query's conditions include its predicate, identical. The
    -- other keys stay merged, estimated jointly (per-key conditions would be estimated as
    -- independent: 100x too few rows for two correlated keys).
    items := '{}';
    if depth = 1 then
        for e in select j.key, j.value from jsonb_each(merged) j
                  where j.key = any(split_keys) order by j.key loop
            split_contains := split_contains || format('%s @> %L::jsonb', md,
                jsonb_build_object(e.key, pgrag._filter_canonical(e.value)));
        end loop;
        merged := merged - split_keys;
    end if;
    if merged <> '{}' then
        items := items || format('%s @> %L::jsonb', md, merged);
    end if;
    items := items || split_contains;
    if cardinality(ranges) > 0 then
        items := items || format('%s @? %L::jsonpath', md,
                                 '$ ? (' || array_to_string(ranges, ' && ') || ')');
    end if;
    for e in select j.key, j.value from jsonb_each(split_ranges) j order by j.key loop
        items := items || format('%s @? %L::jsonpath', md,
            '$ ? ('  || (select string_agg(x, ' && ' order by x)
                          from jsonb_array_elements_text(e.value) x) || ')');
    end loop;
    parts := items || parts;
    expr := case cardinality(parts) when 0 then 'true' when 1 then parts[1]
                 else '(' || array_to_string(parts, ' and ') || ')' end;
end
$$;


create or replace function pgrag._filter_sql(filter jsonb, schema jsonb,
                                             split_keys text[] default '{}',
                                             alias text default 'c')
returns text
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The filter as one boolean SQL expression over the chunks (alias c), every value a literal;
-- 'true' for NULL or {}. schema: the searched types' metadata keys and types
-- (pgrag._filter_schema); split_keys: the keys of the store's filter indexes; alias: of the
-- chunks ('' for none: a filter index's predicate).
declare
    result text;
begin
    if alias !~ '^([a-z_][a-z0-9_]*)?$' then
        raise exception using errcode = 'PR006', message = format('alias %L is not a plain name', alias),
            hint = 'pass a lower-case identifier, or '''' for none';
    end if;
    if filter is null or filter = '{}' then
        return 'true';
    end if;
    if length(filter::text) > pgrag._limit('filter_chars') then
        perform pgrag._filter_invalid(format(
            'filter is %s characters long: keep it under %s',
            to_char(length(filter::text), 'FM999,999,999'),
            to_char(pgrag._limit('filter_chars'), 'FM999,999,999')));
    end if;
    if (select count(*) from jsonb_path_query(filter, 'strict $.**'))
       > pgrag._limit('filter_nodes') then
        perform pgrag._filter_invalid(format(
            'filter has more than %s values: simplify it, or filter on a broader key',
            to_char(pgrag._limit('filter_nodes'), 'FM999,999,999')));
    end if;
    select f.expr into result
      from pgrag._filter_object(filter, coalesce(schema, '{}'), coalesce(split_keys, '{}'), 1,
                                'the filter', alias, 0) f;
    return result;
end
$$;

comment on function pgrag._filter_sql(jsonb, jsonb, text[], text) is
    'A filter as one boolean SQL expression over the chunks (alias c), values as literals';


create or replace function pgrag._filter_schema(doc_types text[] default null)
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The metadata keys a filter over doc_types (every declared type when NULL) may use, with
-- their types: the union of the types' declared metadata_schema. A key declared with two types,
-- or a type not declared, is an error naming the fix.
declare
    merged jsonb;
    agreed boolean;
    e record;
    unknown text;
begin
    if doc_types is not null then
        select string_agg(t, ', ') into unknown
          from unnest(doc_types) t
         where not exists (select from pgrag.doc_types d where d.name = t);
    end if;
    if unknown is not null then
        raise exception using errcode = 'PR003',
            message = format('document type %s is not declared (declared: %s)', unknown,
                             coalesce((select string_agg(d.name, ', ' order by d.name)
                                         from pgrag.doc_types d), 'none')),
            hint = 'pick a declared type; `pgrag documents list` shows them';
    end if;
    -- the common case in one query; the loop below only finds the conflict to name
    select coalesce(jsonb_object_agg(p.key, p.value), '{}'), count(*) = count(distinct p.key)
      into merged, agreed
      from (select distinct s.key, s.value
              from pgrag.doc_types d, jsonb_each(d.metadata_schema) s
             where doc_types is null or d.name = any(doc_types)) p;
    if agreed then
        return merged;
    end if;
    merged := '{}';
    for e in select s.key, s.value, d.name
               from pgrag.doc_types d, jsonb_each(d.metadata_schema) s
              where doc_types is null or d.name = any(doc_types)
              order by d.name, s.key loop
        if merged ? e.key and merged -> e.key <> e.value then
            raise exception using errcode = 'PR003',
                message = format('metadata key %L is %s in one document type and %s in another',
                                 e.key, merged ->> e.key, e.value #>> '{}'),
                hint = 'declare it with one type, or search the document types separately';
        end if;
        merged := merged || jsonb_build_object(e.key, e.value);
    end loop;
    return merged;
end
$$;

comment on function pgrag._filter_schema(text[]) is
    'The metadata keys and types a filter over these document types may use';
