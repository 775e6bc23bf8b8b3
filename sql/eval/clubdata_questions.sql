-- Ground truth for pgrag.lab.eval.clubdata.generate_clubdata_questions (docs/evaluation.md).
--
-- Reads the club's own tables (schema cd: members, facilities, bookings), not pgrag's chunks
-- nor the views of examples/clubdata/documents.sql. One SELECT per "-- name: X" section, run
-- with bound parameters: %(seed)s (text; candidates ordered by md5(key || seed)) and %(lim)s.
-- A booking costs slots x the facility's member cost, or its guest cost for the guest account
-- (memid 0). A member's month document has the key "<memid>:<YYYY-MM>". Members are asked
-- about by name only when no other member has that name (there are two Darren Smiths).
-- No literal percent signs: psycopg reads them as placeholders.

-- name: member_facts
-- Every member with a name of their own, in seed order: one question each (the generator
-- rotates the kind of question), with a facility and a month of theirs picked by the seed.
with costs as (
    select b.memid, b.facid, f.name as facility, b.starttime, b.slots,
           b.slots * case when b.memid = 0 then f.guestcost else f.membercost end as cost
    from cd.bookings b
    join cd.facilities f on f.facid = b.facid
),
named as (
    select m.memid, m.firstname || ' ' || m.surname as name, m.address, m.joindate,
           m.recommendedby
    from cd.members m
    where m.memid <> 0
)
select n.memid, n.name, n.address, n.joindate::date as join_date,
       r.memid as recommender_id, r.firstname || ' ' || r.surname as recommender,
       rec.keys as recommended_keys, rec.names as recommended_names,
       t.bookings, t.slots, t.cost,
       fac.facility, fac.bookings as facility_bookings, fac.slots as facility_slots,
       fac.cost as facility_cost,
       pick.month, mon.bookings as month_bookings, mon.slots as month_slots,
       mon.cost as month_cost, mon.lines as month_lines
from named n
left join cd.members r on r.memid = n.recommendedby
cross join lateral (
    select array_agg(x.memid::text order by x.memid) as keys,
           string_agg(x.firstname || ' ' || x.surname || ' (member ' || x.memid || ')', ', '
                      order by x.memid) as names
    from cd.members x
    where x.recommendedby = n.memid
) rec
cross join lateral (
    select count(*)::integer as bookings, coalesce(sum(c.slots), 0)::integer as slots,
           coalesce(sum(c.cost), 0) as cost
    from costs c
    where c.memid = n.memid
) t
left join lateral (
    select c.facility, count(*)::integer as bookings, sum(c.slots)::integer as slots,
           sum(c.cost) as cost
    from costs c
    where c.memid = n.memid
    group by c.facility
    order by md5(n.memid::text || c.facility || %(seed)s), c.facility
    limit 1
) fac on true
left join lateral (
    select x.month
    from (select distinct date_trunc('month', c.starttime)::date as month
            from costs c
           where c.memid = n.memid) x
    order by md5(n.memid::text || to_char(x.month, 'YYYY-MM') || %(seed)s), x.month
    limit 1
) pick on true
left join lateral (
    select sum(p.bookings)::integer as bookings, sum(p.slots)::integer as slots,
           sum(p.cost) as cost,
           string_agg(p.facility || ' (' || p.slots || ' slots)', ', '
                      order by p.slots desc, p.facility) as lines
    from (select c.facility, count(*) as bookings, sum(c.slots) as slots, sum(c.cost) as cost
            from costs c
           where c.memid = n.memid and date_trunc('month', c.starttime)::date = pick.month
           group by c.facility) p
) mon on true
where not exists (select from named o where o.name = n.name and o.memid <> n.memid)
order by md5(n.memid::text || %(seed)s), n.memid;

-- name: facility_facts
-- Every facility in seed order, with its bookings, revenue and the member(s) who booked the
-- most slots on it (guests aside).
with costs as (
    select b.memid, b.facid, b.slots,
           b.slots * case when b.memid = 0 then f.guestcost else f.membercost end as cost
    from cd.bookings b
    join cd.facilities f on f.facid = b.facid
),
per_member as (
    select c.facid, c.memid, sum(c.slots)::integer as slots
    from costs c
    where c.memid <> 0
    group by c.facid, c.memid
)
select f.facid, f.name, f.membercost, f.guestcost, t.bookings, t.slots, t.revenue,
       top.slots as top_slots, top.keys as top_keys, top.names as top_names
from cd.facilities f
cross join lateral (
    select count(*)::integer as bookings, coalesce(sum(c.slots), 0)::integer as slots,
           coalesce(sum(c.cost), 0) as revenue
    from costs c
    where c.facid = f.facid
) t
left join lateral (
    select max(p.slots) as slots,
           array_agg(p.memid::text order by p.memid) as keys,
           string_agg(m.firstname || ' ' || m.surname || ' (member ' || m.memid || ')', ', '
                      order by m.memid) as names
    from per_member p
    join cd.members m on m.memid = p.memid
    where p.facid = f.facid
      and p.slots = (select max(q.slots) from per_member q where q.facid = f.facid)
) top on true
order by md5(f.facid::text || %(seed)s), f.facid;

-- name: town_members
-- A member's town: the last part of the address that is not a zip code.
with towns as (
    select m.memid, m.firstname || ' ' || m.surname as name,
           trim((regexp_match(regexp_replace(m.address, ',\s*\d+\s*$', ''), '([^,]+)$'))[1])
               as town
    from cd.members m
    where m.memid <> 0
)
select t.town, array_agg(t.memid::text order by t.memid) as keys,
       string_agg(t.name || ' (member ' || t.memid || ')', ', ' order by t.memid) as names
from towns t
group by t.town
having count(*) between 2 and 6
order by md5(t.town || %(seed)s), t.town
limit %(lim)s;

-- name: joined_month
select date_trunc('month', m.joindate)::date as month,
       array_agg(m.memid::text order by m.memid) as keys,
       string_agg(m.firstname || ' ' || m.surname || ' (member ' || m.memid || ')', ', '
                  order by m.memid) as names
from cd.members m
where m.memid <> 0
group by 1
having count(*) between 1 and 12
order by md5(to_char(date_trunc('month', m.joindate)::date, 'YYYY-MM') || %(seed)s), 1
limit %(lim)s;

-- name: facility_month_members
-- Facilities booked by few members (guests aside) in a month: those members' month documents.
select f.name as facility, date_trunc('month', b.starttime)::date as month,
       array_agg(distinct b.memid::text || ':' || to_char(b.starttime, 'YYYY-MM')) as keys,
       string_agg(distinct m.firstname || ' ' || m.surname || ' (member ' || m.memid || ')',
                  ', ') as names
from cd.bookings b
join cd.facilities f on f.facid = b.facid
join cd.members m on m.memid = b.memid
where b.memid <> 0
group by 1, 2
having count(distinct b.memid) between 1 and 5
order by md5(f.name || to_char(date_trunc('month', b.starttime)::date, 'YYYY-MM') || %(seed)s), 1, 2
limit %(lim)s;

-- name: guest_months
select date_trunc('month', b.starttime)::date as month, count(*)::integer as bookings,
       sum(b.slots)::integer as slots, sum(b.slots * f.guestcost) as cost
from cd.bookings b
join cd.facilities f on f.facid = b.facid
where b.memid = 0
group by 1
order by md5(to_char(date_trunc('month', b.starttime)::date, 'YYYY-MM') || %(seed)s), 1
limit %(lim)s;

-- name: bounds
select (select min(b.starttime)::date from cd.bookings b) as first_day,
       (select max(b.starttime)::date from cd.bookings b) as last_day,
       (select m.firstname || ' ' || m.surname
          from cd.members m
         where m.memid <> 0
           and not exists (select from cd.members o
                            where o.memid <> m.memid and o.firstname = m.firstname
                              and o.surname = m.surname)
         order by m.memid
         limit 1) as some_name;

-- name: absent_members
select n as name
from unnest(%(names)s::text[]) with ordinality as t(n, i)
where not exists (select from cd.members m where m.firstname || ' ' || m.surname = t.n)
order by t.i
limit %(lim)s;

-- name: absent_facilities
select n as name
from unnest(%(names)s::text[]) with ordinality as t(n, i)
where not exists (select from cd.facilities f where f.name = t.n)
order by t.i
limit %(lim)s;
