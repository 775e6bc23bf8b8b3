"""pgrag on the pgexercises club database (schema cd), through the public API only.

The documents of examples/clubdata/documents.sql, their triggers, the club's question set
(pgrag.lab.eval.clubdata) and its exact statistics, against the club's own tables.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgrag import documents

from .conftest import REPO, psql_file

CLUBDATA = REPO / "examples" / "clubdata"


@pytest.fixture
def clubdata(db_url: str) -> str:
    psql_file(db_url, CLUBDATA / "clubdata.sql")
    psql_file(db_url, CLUBDATA / "documents.sql")
    return db_url


def _fits(type_name: str, value: Any) -> bool:
    """A stored metadata value has the JSON form of its declared type."""
    if type_name.endswith("[]"):
        return isinstance(value, list) and all(_fits(type_name[:-2], v) for v in value)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "numeric":
        return isinstance(value, int | float | Decimal) and not isinstance(value, bool)
    if type_name == "date":
        return isinstance(value, str) and dt.date.fromisoformat(value).isoformat() == value
    return type_name == "text" and isinstance(value, str)


def test_clubdata_documents_are_complete_typed_and_in_sync(clubdata: str) -> None:
    with psycopg.connect(clubdata) as conn:
        counts: dict[str, int] = dict(
            conn.execute("select doc_type, count(*) from pgrag.chunks group by 1").fetchall()
        )
        assert counts == {"club_member": 31, "club_facility": 9, "club_member_month": 60}

        tim = conn.execute(
            "select text, metadata from pgrag.chunks where doc_type = 'club_member' "
            "and source_key = '3'"
        ).fetchone()
        assert tim is not None
        assert tim[0].startswith("Tim Rownam (member 3), 23 Highway Way, Boston, zip code 23423.")
        assert "Recommended 1 member: Tim Boothe (member 8)." in tim[0]
        truth = conn.execute(
            "select count(*), sum(b.slots), sum(b.slots * f.membercost) from cd.bookings b "
            "join cd.facilities f on f.facid = b.facid where b.memid = 3"
        ).fetchone()
        assert truth is not None
        assert (tim[1]["booking_count"], tim[1]["total_slots"]) == (truth[0], truth[1])
        assert Decimal(str(tim[1]["total_cost"])) == truth[2]
        assert tim[1]["town"] == "Boston" and tim[1]["recommended"] == ["Tim Boothe"]

        guest = conn.execute(
            "select metadata from pgrag.chunks where doc_type = 'club_member' and source_key = '0'"
        ).fetchone()
        guest_cost = conn.execute(
            "select sum(b.slots * f.guestcost) from cd.bookings b "
            "join cd.facilities f on f.facid = b.facid where b.memid = 0"
        ).fetchone()
        assert guest is not None and guest_cost is not None
        assert guest[0]["is_guest"] is True
        assert Decimal(str(guest[0]["total_cost"])) == guest_cost[0]

        # every month document hangs under its member's profile
        orphans = conn.execute(
            "select count(*) from pgrag.chunks c where c.doc_type = 'club_member_month' "
            "and (c.parent_id is null or c.source_key not like c.parent_key || ':%')"
        ).fetchone()
        assert orphans == (0,)

        # every metadata key is declared, and every value has its declared type
        schemas: dict[str, Any] = dict(
            conn.execute("select name, metadata_schema from pgrag.doc_types")
        )
        for doc_type, key, metadata in conn.execute(
            "select doc_type, source_key, metadata::text from pgrag.chunks"
        ):
            values = json.loads(metadata, parse_float=Decimal)
            schema = schemas[doc_type]
            assert set(values) <= set(schema), (doc_type, key)
            for name, value in values.items():
                assert _fits(schema[name], value), (doc_type, key, name, value)
        assert documents.verify(conn) == []


def _changed_by(conn: psycopg.Connection[Any], statement: str) -> list[tuple[str, str]]:
    """The chunks whose text or metadata a statement changed, added or removed."""
    before = {
        (t, k): (text, m)
        for t, k, text, m in conn.execute(
            "select doc_type, source_key, text, metadata from pgrag.chunks"
        )
    }
    conn.execute(statement)
    conn.execute("select pgrag.sync_now()")  # render now, not at commit: read them here
    after = {
        (t, k): (text, m)
        for t, k, text, m in conn.execute(
            "select doc_type, source_key, text, metadata from pgrag.chunks"
        )
    }
    return sorted(d for d in before.keys() | after.keys() if before.get(d) != after.get(d))


def test_one_booking_change_rebuilds_exactly_its_member_month_and_facility(
    clubdata: str,
) -> None:
    with psycopg.connect(clubdata) as conn:
        changed = _changed_by(conn, "update cd.bookings set slots = slots + 1 where bookid = 8")
        # booking 8: Tim Rownam (member 3), Massage Room 1 (facility 4), 2012-07-04
        assert changed == [
            ("club_facility", "4"),
            ("club_member", "3"),
            ("club_member_month", "3:2012-07"),
        ]
        assert documents.verify(conn) == []


def test_a_moved_booking_renders_both_sides(clubdata: str) -> None:
    with psycopg.connect(clubdata) as conn:
        # booking 4043 is member 5's only booking of January 2013 (Pool Table, facility 8)
        changed = _changed_by(
            conn,
            "update cd.bookings set memid = 4, starttime = '2012-11-05 10:00', facid = 0 "
            "where bookid = 4043",
        )
        assert changed == [
            ("club_facility", "0"),
            ("club_facility", "8"),
            ("club_member", "4"),
            ("club_member", "5"),
            ("club_member_month", "4:2012-11"),  # new
            ("club_member_month", "5:2013-01"),  # gone
        ]
        keys = {k for (k,) in conn.execute("select source_key from pgrag.chunks")}
        assert "4:2012-11" in keys and "5:2013-01" not in keys
        # a renamed member renders their profile, months, facilities and whom they recommended
        changed = _changed_by(conn, "update cd.members set firstname = 'Timothy' where memid = 3")
        assert ("club_member", "8") in changed  # Tim Boothe: "recommended by Timothy Rownam"
        assert ("club_member_month", "3:2012-08") in changed
        assert documents.verify(conn) == []


def test_clubdata_questions_point_at_chunks_that_exist(clubdata: str) -> None:
    from pgrag.lab.eval.clubdata import generate_clubdata_questions

    with psycopg.connect(clubdata) as conn:
        questions = generate_clubdata_questions(conn)
        small = generate_clubdata_questions(conn, limit_per_template=2, seed=3)
        keys = set(conn.execute("select doc_type, source_key from pgrag.chunks").fetchall())
        for q in questions + small:
            assert {(r.doc_type, r.source_key) for r in q.relevant} <= keys, q
            assert (q.relevant == ()) == (q.category in ("edge", "adversarial")), q
            if not q.filters:
                continue
            # the question's filter, over its relevant types, matches every relevant chunk
            types = sorted({r.doc_type for r in q.relevant})
            row = conn.execute(
                "select pgrag.check_filter(%s, %s)", (Jsonb(q.filters), types)
            ).fetchone()
            assert row is not None
            where = str(row[0]).replace("%", "%%").encode()
            found = set(
                conn.execute(
                    b"select c.doc_type, c.source_key from pgrag.chunks c "
                    b"where c.doc_type = any(%(types)s) and " + where,
                    {"types": types},
                ).fetchall()
            )
            assert {(r.doc_type, r.source_key) for r in q.relevant} <= found, q
    for qs in (questions, small):
        ids = [q.id for q in qs]
        assert len(ids) == len(set(ids))
    assert 40 <= len(questions) <= 80
    assert {q.category for q in questions} == {
        "lookups",
        "relations",
        "time-filtered",
        "aggregates",
        "edge",
        "adversarial",
    }
    # each member asked about once at most, whatever the template
    members = [
        q.filters["member_id"]
        for q in questions
        if q.filters and "member_id" in q.filters and q.id.startswith("club-member")
    ]
    assert len(members) == len(set(members))
    assert all(re.fullmatch(r"club-[a-z-]+-\d{3}", i) for i in ids)


# The club's own numbers, from its tables (not from the documents' views): a booking costs
# slots x the member cost, or the guest cost for the guest account (memid 0).
_TRUTH = """
with b as (
    select b.bookid, b.memid, b.facid, b.slots, date_trunc('month', b.starttime)::date as month,
           b.slots * case when b.memid = 0 then f.guestcost else f.membercost end as cost
    from cd.bookings b
    join cd.facilities f on f.facid = b.facid
    where (%(member)s::integer is null or b.memid = %(member)s)
      and (%(month)s::date is null or date_trunc('month', b.starttime) = %(month)s)
      and (%(facility)s::text is null or f.name = %(facility)s)
)
select jsonb_build_object(
    'booking_count', count(*), 'total_slots', coalesce(sum(b.slots), 0),
    'total_cost', coalesce(sum(b.cost), 0),
    'member_cost', coalesce(sum(b.cost) filter (where b.memid <> 0), 0),
    'guest_cost', coalesce(sum(b.cost) filter (where b.memid = 0), 0),
    'average_slots_per_booking', round(avg(b.slots), 2),
    'average_cost_per_booking', round(avg(b.cost), 2),
    'members', count(distinct b.memid) filter (where b.memid <> 0),
    'months', count(distinct (b.memid, b.month)),
    'facilities', count(distinct b.facid))::text
from b
"""


def _json(conn: psycopg.Connection[Any], query: str, params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return json.loads(row[0], parse_float=Decimal)


def _cents(x: Decimal) -> Decimal:
    return x.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)  # numeric round(), x >= 0


def _member_stats(t: Any, profiles: int) -> dict[str, Any]:
    """club_member's statistics over ``profiles`` matching members with bookings ``t``."""
    return {
        "member_count": profiles,
        "booking_count": t["booking_count"],
        "total_slots": t["total_slots"],
        "total_cost": t["total_cost"],
        "average_slots_per_booking": t["average_slots_per_booking"],
        "average_cost_per_booking": t["average_cost_per_booking"],
        "average_cost_per_member": _cents(Decimal(t["member_cost"]) / profiles)
        if profiles
        else None,
    }


def _month_stats(t: Any) -> dict[str, Any]:
    return {
        "member_count": t["members"],
        "month_count": t["months"],
        "booking_count": t["booking_count"],
        "total_slots": t["total_slots"],
        "total_cost": t["total_cost"],
        "average_slots_per_booking": t["average_slots_per_booking"],
        "average_cost_per_booking": t["average_cost_per_booking"],
    }


def _facility_stats(t: Any) -> dict[str, Any]:
    return {
        "facility_count": t["facilities"],
        "booking_count": t["booking_count"],
        "total_slots": t["total_slots"],
        "revenue": t["total_cost"],
        "member_revenue": t["member_cost"],
        "guest_revenue": t["guest_cost"],
        "average_slots_per_booking": t["average_slots_per_booking"],
        "average_revenue_per_booking": t["average_cost_per_booking"],
    }


def test_clubdata_statistics_are_the_sql_truth(clubdata: str) -> None:
    with psycopg.connect(clubdata) as conn:
        declared = conn.execute("select doc_type from pgrag.doc_stats order by 1").fetchall()
        assert declared == [("club_facility",), ("club_member",), ("club_member_month",)]

        def stats(flt: Any, types: list[str] | None = None) -> Any:
            return _json(
                conn,
                "select pgrag.stats(%s, %s)::text",
                (None if flt is None else Jsonb(flt), types),
            )

        def truth(
            member: int | None = None, month: str | None = None, facility: str | None = None
        ) -> Any:
            return _json(conn, _TRUTH, {"member": member, "month": month, "facility": facility})

        every = truth()
        assert (every["booking_count"], every["total_slots"]) == (4044, 9192)
        assert every["total_cost"] == Decimal("132584.5")
        assert (every["members"], every["months"], every["facilities"]) == (29, 60, 9)
        # unfiltered: every profile (30 members, member 37 without bookings among them, and the
        # guest account, which member_count leaves out), every member's month, every facility
        assert stats(None) == {
            "club_member": _member_stats(every, 30),
            "club_member_month": _month_stats(every),
            "club_facility": _facility_stats(every),
        }

        # filtered by a member: their profile and months; no facility carries member_id
        tim = truth(member=3)
        assert stats({"member_id": 3}) == {
            "club_member": _member_stats(tim, 1),
            "club_member_month": _month_stats(tim),
            "club_facility": _facility_stats(truth(member=-1)),  # nothing matches
        }

        # filtered by a month, one type: the month documents of August 2012
        august = truth(month="2012-08-01")
        got = stats({"month": "2012-08-01"}, ["club_member_month"])
        assert got == {"club_member_month": _month_stats(august)}

        # filtered by a facility: its document
        court = truth(facility="Tennis Court 1")
        got = stats({"facility": "Tennis Court 1"}, ["club_facility"])
        assert got == {"club_facility": _facility_stats(court)}
