-- pgrag on the pgexercises club database (examples/clubdata/DATASET.md): members who recommend
-- each other, facilities with member and guest prices, bookings of half-hour slots.
-- Load the club first (its tables land in schema cd), migrate pgrag, then run this file:
--   psql -X -v ON_ERROR_STOP=1 -d "$URL" -f examples/clubdata/documents.sql
-- Only pgrag's public SQL API is used: pgrag.declare_document, pgrag.declare_stats and
-- pgrag.refresh.
--
-- Three document types (100 chunks):
--   club_member        one per member (31, the guest account memid 0 included): name, address,
--                      join date, who recommended them and whom they recommended, and their
--                      bookings per facility (bookings, slots, cost)
--   club_facility      one per facility (9): prices, what it costs to run, its bookings and
--                      revenue, who books it most
--   club_member_month  one per member and month with bookings (60), a child of club_member:
--                      that month's bookings per facility
--
-- Why a member's month, not one document per booking: a booking is one line ("Tennis Court 1,
-- 2 slots, 2012-07-03 11:00"). 4,044 near-identical chunks would embed alike and crowd each
-- other out of the top k, and a question about a month ("what did Tim Rownam book in August
-- 2012?") would have dozens of relevant chunks instead of one. A member's month answers it in
-- one document, stays short however many bookings it holds (at most one line per facility),
-- and a changed booking renders one of them. Exact numbers over any set of bookings come from
-- the statistics at the end, not from the text.
--
-- A booking's cost is slots x the facility's member cost, or its guest cost for the guest
-- account (memid 0), as pgexercises counts it.

-- One row per booking with its facility and cost, and the key of its member's month.
-- The key is "<memid>:<YYYY-MM>" (e.g. "3:2012-08"), built from immutable functions only so an
-- index can hold it: the same expression is in the index below and in the bookings key query of
-- club_member_month. Keep the three identical.
create or replace view cd.club_booking_cost as
select b.bookid, b.memid, b.facid, f.name as facility, b.starttime, b.slots,
       b.slots * case when b.memid = 0 then f.guestcost else f.membercost end as cost,
       date_trunc('month', b.starttime)::date as month,
       b.memid::text || ':' || extract(year from b.starttime)::integer::text || '-'
           || lpad(extract(month from b.starttime)::integer::text, 2, '0') as month_key
from cd.bookings b
join cd.facilities f on f.facid = b.facid;

-- A keyed render of club_member_month filters on month_key: this index makes it an index scan.
create index if not exists "bookings.month_key" on cd.bookings
    ((memid::text || ':' || extract(year from starttime)::integer::text || '-'
      || lpad(extract(month from starttime)::integer::text, 2, '0')));

-- Member profile: who they are, the recommendations both ways, their bookings per facility.
create or replace view cd.club_member_doc as
select m.memid as source_key,
       concat_ws(E'\n',
           case when m.memid = 0
                then 'Guest bookings (member 0, GUEST GUEST): bookings made for guests, who '
                     'pay the guest price of each facility.'
                else format('%s %s (member %s), %s, zip code %s. Joined the club on %s.',
                            m.firstname, m.surname, m.memid, m.address, m.zipcode,
                            to_char(m.joindate, 'YYYY-MM-DD')) end,
           case when m.memid <> 0
                then format('Recommended by %s. %s',
                            case when r.memid is null then 'nobody'
                                 else format('%s %s (member %s)', r.firstname, r.surname,
                                             r.memid) end,
                            case when rec.n = 0 then 'Has recommended nobody.'
                                 else format('Recommended %s: %s.',
                                             case when rec.n = 1 then '1 member'
                                                  else rec.n || ' members' end,
                                             rec.names) end) end,
           case when t.bookings = 0 then 'No bookings.'
                else format('%s booking%s, %s slots (%s hours), total cost $%s, from %s to %s.',
                            t.bookings, case when t.bookings <> 1 then 's' end, t.slots,
                            trim_scale(t.slots / 2.0),
                            to_char(t.cost, 'FM999,999,990.00'),
                            to_char(t.first_day, 'YYYY-MM-DD'),
                            to_char(t.last_day, 'YYYY-MM-DD')) end,
           case when t.bookings > 0 then format('By facility: %s.', t.lines) end
       ) as text,
       jsonb_strip_nulls(jsonb_build_object(
           'member_id', m.memid,
           'member_name', m.firstname || ' ' || m.surname,
           'firstname', m.firstname,
           'surname', m.surname,
           'town', case when m.memid <> 0
                        then trim((regexp_match(regexp_replace(m.address, ',\s*\d+\s*$', ''),
                                                '([^,]+)$'))[1]) end,
           'join_date', m.joindate::date,
           'is_guest', m.memid = 0,
           'has_recommender', m.recommendedby is not null,
           'recommended_by_id', m.recommendedby,
           'recommended_by', r.firstname || ' ' || r.surname,
           'recommended', to_jsonb(coalesce(rec.name_list, '{}')),
           'recommended_count', rec.n,
           'facilities', to_jsonb(coalesce(t.facilities, '{}')),
           'booking_count', t.bookings,
           'total_slots', t.slots,
           'total_cost', t.cost,
           'first_booking_date', t.first_day,
           'last_booking_date', t.last_day)) as metadata
from cd.members m
left join cd.members r on r.memid = m.recommendedby
cross join lateral (
    select count(*)::integer as n,
           string_agg(format('%s %s (member %s)', x.firstname, x.surname, x.memid), ', '
                      order by x.memid) as names,
           array_agg(x.firstname || ' ' || x.surname order by x.memid) as name_list
    from cd.members x
    where x.recommendedby = m.memid
) rec
cross join lateral (
    select coalesce(sum(f.bookings), 0)::integer as bookings,
           coalesce(sum(f.slots), 0)::integer as slots,
           coalesce(sum(f.cost), 0) as cost,
           min(f.first_day) as first_day, max(f.last_day) as last_day,
           string_agg(format('%s: %s booking%s, %s slots, $%s', f.facility, f.bookings,
                             case when f.bookings <> 1 then 's' end, f.slots,
                             to_char(f.cost, 'FM999,999,990.00')),
                      '; ' order by f.slots desc, f.facility) as lines,
           array_agg(f.facility::text order by f.facility) as facilities
    from (select b.facility, count(*) as bookings, sum(b.slots) as slots, sum(b.cost) as cost,
                 min(b.starttime)::date as first_day, max(b.starttime)::date as last_day
            from cd.club_booking_cost b
           where b.memid = m.memid
           group by b.facility) f
) t;

-- Facility: prices, running costs, bookings and revenue, and the members who book it most.
create or replace view cd.club_facility_doc as
select f.facid as source_key,
       concat_ws(E'\n',
           format('%s (facility %s): members pay $%s and guests $%s per half-hour slot%s.',
                  f.name, f.facid, to_char(f.membercost, 'FM999,990.00'),
                  to_char(f.guestcost, 'FM999,990.00'),
                  case when f.membercost = 0 then ' (free for members)' end),
           format('Initial outlay $%s, monthly maintenance $%s.',
                  to_char(f.initialoutlay, 'FM999,999,990.00'),
                  to_char(f.monthlymaintenance, 'FM999,999,990.00')),
           case when t.bookings = 0 then 'No bookings.'
                else format('%s bookings, %s slots (%s hours), from %s to %s. Revenue $%s: '
                            'members $%s (%s bookings), guests $%s (%s bookings).',
                            t.bookings, t.slots, trim_scale(t.slots / 2.0),
                            to_char(t.first_day, 'YYYY-MM-DD'),
                            to_char(t.last_day, 'YYYY-MM-DD'),
                            to_char(t.revenue, 'FM999,999,990.00'),
                            to_char(t.revenue - t.guest_revenue, 'FM999,999,990.00'),
                            t.bookings - t.guest_bookings,
                            to_char(t.guest_revenue, 'FM999,999,990.00'),
                            t.guest_bookings) end,
           case when top.names is not null then format('Booked most by %s.', top.names) end
       ) as text,
       jsonb_strip_nulls(jsonb_build_object(
           'facility_id', f.facid,
           'facility', f.name,
           'member_cost', f.membercost,
           'guest_cost', f.guestcost,
           'initial_outlay', f.initialoutlay,
           'monthly_maintenance', f.monthlymaintenance,
           'booking_count', t.bookings,
           'total_slots', t.slots,
           'revenue', t.revenue,
           'first_booking_date', t.first_day,
           'last_booking_date', t.last_day)) as metadata
from cd.facilities f
cross join lateral (
    select count(*)::integer as bookings,
           coalesce(sum(b.slots), 0)::integer as slots,
           coalesce(sum(b.cost), 0) as revenue,
           coalesce(sum(b.cost) filter (where b.memid = 0), 0) as guest_revenue,
           (count(*) filter (where b.memid = 0))::integer as guest_bookings,
           min(b.starttime)::date as first_day, max(b.starttime)::date as last_day
    from cd.club_booking_cost b
    where b.facid = f.facid
) t
cross join lateral (
    select string_agg(format('%s %s (member %s, %s slots)', m.firstname, m.surname, m.memid,
                             x.slots), ', ' order by x.slots desc, x.memid) as names
    from (select b.memid, sum(b.slots) as slots
            from cd.bookings b
           where b.facid = f.facid and b.memid <> 0
           group by b.memid
           order by sum(b.slots) desc, b.memid
           limit 3) x
    join cd.members m on m.memid = x.memid
) top;

-- A member's month: that month's bookings per facility; a child of the member's profile.
-- Its text depends on its own bookings, its member and the facilities, never on other months.
create or replace view cd.club_member_month_doc as
select k.month_key as source_key,
       k.memid as parent_key,
       concat_ws(E'\n',
           format('%s (member %s), bookings in %s: %s booking%s, %s slots (%s hours), '
                  'cost $%s, from %s to %s.',
                  case when m.memid = 0 then 'Guests' else m.firstname || ' ' || m.surname end,
                  m.memid, to_char(k.month, 'FMMonth YYYY'), t.bookings,
                  case when t.bookings <> 1 then 's' end, t.slots,
                  trim_scale(t.slots / 2.0), to_char(t.cost, 'FM999,999,990.00'),
                  to_char(t.first_day, 'YYYY-MM-DD'), to_char(t.last_day, 'YYYY-MM-DD')),
           format('By facility: %s.', t.lines)
       ) as text,
       jsonb_build_object(
           'month_key', k.month_key,
           'member_id', m.memid,
           'member_name', m.firstname || ' ' || m.surname,
           'is_guest', m.memid = 0,
           'month', k.month,
           'facilities', to_jsonb(t.facilities),
           'booking_count', t.bookings,
           'total_slots', t.slots,
           'total_cost', t.cost,
           'first_booking_date', t.first_day,
           'last_booking_date', t.last_day) as metadata
from (select b.month_key, b.memid, b.month
        from cd.club_booking_cost b
       group by b.month_key, b.memid, b.month) k
join cd.members m on m.memid = k.memid
cross join lateral (
    select sum(f.bookings)::integer as bookings, sum(f.slots)::integer as slots,
           sum(f.cost) as cost, min(f.first_day) as first_day, max(f.last_day) as last_day,
           string_agg(format('%s: %s booking%s, %s slots, $%s', f.facility, f.bookings,
                             case when f.bookings <> 1 then 's' end, f.slots,
                             to_char(f.cost, 'FM999,999,990.00')),
                      '; ' order by f.slots desc, f.facility) as lines,
           array_agg(f.facility::text order by f.facility) as facilities
    from (select b.facility, count(*) as bookings, sum(b.slots) as slots, sum(b.cost) as cost,
                 min(b.starttime)::date as first_day, max(b.starttime)::date as last_day
            from cd.club_booking_cost b
           where b.memid = k.memid
             and b.starttime >= k.month and b.starttime < k.month + interval '1 month'
           group by b.facility) f
) t;

select pgrag.declare_document(
    name => 'club_member',
    source => 'cd.club_member_doc',
    watches => jsonb_build_object(
        -- the member, the recommender they had and have (their "recommended" list), and the
        -- members they recommended (whose text names them)
        'cd.members',
            'select c.memid from changed c
             union select c.recommendedby from changed c where c.recommendedby is not null
             union select x.memid from changed c join cd.members x on x.recommendedby = c.memid',
        'cd.bookings', 'select memid from changed',
        'cd.facilities',
            'select distinct b.memid from changed f join cd.bookings b on b.facid = f.facid'
    ),
    metadata_schema => '{"member_id": "integer", "member_name": "text", "firstname": "text",
      "surname": "text", "town": "text", "join_date": "date", "is_guest": "boolean",
      "has_recommender": "boolean", "recommended_by_id": "integer", "recommended_by": "text",
      "recommended": "text[]", "recommended_count": "integer", "facilities": "text[]",
      "booking_count": "integer", "total_slots": "integer", "total_cost": "numeric",
      "first_booking_date": "date", "last_booking_date": "date"}'
);

select pgrag.declare_document(
    name => 'club_facility',
    source => 'cd.club_facility_doc',
    watches => jsonb_build_object(
        'cd.facilities', 'select facid from changed',
        'cd.bookings', 'select facid from changed',
        -- the text names the members who book it most
        'cd.members',
            'select distinct b.facid from changed m join cd.bookings b on b.memid = m.memid'
    ),
    metadata_schema => '{"facility_id": "integer", "facility": "text", "member_cost": "numeric",
      "guest_cost": "numeric", "initial_outlay": "numeric", "monthly_maintenance": "numeric",
      "booking_count": "integer", "total_slots": "integer", "revenue": "numeric",
      "first_booking_date": "date", "last_booking_date": "date"}'
);

select pgrag.declare_document(
    name => 'club_member_month',
    source => 'cd.club_member_month_doc',
    watches => jsonb_build_object(
        -- the month_key expression of cd.club_booking_cost, over the changed rows themselves:
        -- a deleted booking is no longer in the view
        'cd.bookings',
            'select memid::text || '':'' || extract(year from starttime)::integer::text || ''-''
                    || lpad(extract(month from starttime)::integer::text, 2, ''0'')
               from changed',
        'cd.members',
            'select distinct b.month_key from changed m
               join cd.club_booking_cost b on b.memid = m.memid',
        'cd.facilities',
            'select distinct b.month_key from changed f
               join cd.club_booking_cost b on b.facid = f.facid'
    ),
    parent_type => 'club_member',
    metadata_schema => '{"month_key": "text", "member_id": "integer", "member_name": "text",
      "is_guest": "boolean", "month": "date", "facilities": "text[]", "booking_count": "integer",
      "total_slots": "integer", "total_cost": "numeric", "first_booking_date": "date",
      "last_booking_date": "date"}'
);

-- Exact statistics (docs/search.md, "Exact statistics"): each query runs over the CTE hits,
-- every chunk of its type matching a search's filter (not only the top k), and counts the
-- bookings behind them in cd.bookings, never the text.
--
--   club_member        the bookings of the matching members
--     member_count, booking_count, total_slots, total_cost, average_slots_per_booking,
--     average_cost_per_booking, average_cost_per_member
--   club_member_month  the bookings of the matching members' months
--     member_count, month_count, booking_count, total_slots, total_cost,
--     average_slots_per_booking, average_cost_per_booking
--   club_facility      the bookings of the matching facilities
--     facility_count, booking_count, total_slots, revenue, member_revenue, guest_revenue,
--     average_slots_per_booking, average_revenue_per_booking
--
-- member_count leaves out the guest account (memid 0); bookings, slots and costs include its
-- bookings, and average_cost_per_member is the members' cost (guests' left out) per member.
-- Averages are rounded to hundredths; over no bookings (or no members) they are null.

select pgrag.declare_stats('club_member', $stats$
select jsonb_build_object(
    'member_count', count(distinct h.source_key) filter (where h.source_key <> '0'),
    'booking_count', count(b.bookid),
    'total_slots', coalesce(sum(b.slots), 0),
    'total_cost', coalesce(sum(b.cost), 0),
    'average_slots_per_booking', round(avg(b.slots), 2),
    'average_cost_per_booking', round(avg(b.cost), 2),
    'average_cost_per_member',
        round(coalesce(sum(b.cost) filter (where b.memid <> 0), 0)
              / nullif(count(distinct h.source_key) filter (where h.source_key <> '0'), 0), 2))
from hits h
left join cd.club_booking_cost b on b.memid = h.source_key::integer
$stats$);

select pgrag.declare_stats('club_member_month', $stats$
select jsonb_build_object(
    'member_count', count(distinct h.parent_key) filter (where h.parent_key <> '0'),
    'month_count', count(distinct h.source_key),
    'booking_count', count(b.bookid),
    'total_slots', coalesce(sum(b.slots), 0),
    'total_cost', coalesce(sum(b.cost), 0),
    'average_slots_per_booking', round(avg(b.slots), 2),
    'average_cost_per_booking', round(avg(b.cost), 2))
from hits h
left join cd.club_booking_cost b on b.month_key = h.source_key
$stats$);

select pgrag.declare_stats('club_facility', $stats$
select jsonb_build_object(
    'facility_count', count(distinct h.source_key),
    'booking_count', count(b.bookid),
    'total_slots', coalesce(sum(b.slots), 0),
    'revenue', coalesce(sum(b.cost), 0),
    'member_revenue', coalesce(sum(b.cost) filter (where b.memid <> 0), 0),
    'guest_revenue', coalesce(sum(b.cost) filter (where b.memid = 0), 0),
    'average_slots_per_booking', round(avg(b.slots), 2),
    'average_revenue_per_booking', round(avg(b.cost), 2))
from hits h
left join cd.club_booking_cost b on b.facid = h.source_key::integer
$stats$);

-- To compute each filter's statistics once and reuse them until a write to cd.bookings,
-- cd.facilities or the chunks (docs/search.md, "The statistics cache"):
--   select pgrag.cache_stats('club_member');  -- and club_member_month, club_facility

select pgrag.refresh('club_member');
select pgrag.refresh('club_facility');
select pgrag.refresh('club_member_month');
