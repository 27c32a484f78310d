"""Front-month choice per CME session: previous session's activity, no look-ahead, no roll-back."""

from __future__ import annotations

import datetime as dt

import numpy as np

from alpha_core.data.front_month import choose_front, stitch
from alpha_core.sessions import session_days

H4, M4, U4 = 1, 2, 3
SYMBOLS = {H4: "ESH4", M4: "ESM4", U4: "ESU4"}


def day(d: str) -> int:
    return int(np.datetime64(d, "D").astype(np.int64))


def table(rows):
    """rows: (session, instrument, activity) -> per-row arrays."""
    s, i, a = zip(*rows, strict=True)
    return np.array([day(x) for x in s]), np.array(i), np.array(a, dtype=float)


def test_session_starts_at_17_chicago():
    ts = np.array(
        [
            np.datetime64("2024-03-12T21:59:59", "ns"),  # 16:59 CDT on the 12th -> session of the 12th
            np.datetime64("2024-03-12T22:00:00", "ns"),  # 17:00 CDT -> session of the 13th
            np.datetime64("2024-01-10T22:59:00", "ns"),  # 16:59 CST (winter) -> session of the 10th
            np.datetime64("2024-01-10T23:00:00", "ns"),  # 17:00 CST -> session of the 11th
        ]
    ).astype(np.int64)
    assert [str(np.datetime64(int(d), "D")) for d in session_days(ts)] == [
        "2024-03-12",
        "2024-03-13",
        "2024-01-10",
        "2024-01-11",
    ]


def test_front_follows_previous_session_volume_without_look_ahead():
    sessions, ids, act = table(
        [
            ("2024-03-11", H4, 900),
            ("2024-03-11", M4, 100),
            ("2024-03-12", H4, 300),
            ("2024-03-12", M4, 700),  # M4 wins the 12th ...
            ("2024-03-13", H4, 100),
            ("2024-03-13", M4, 900),  # ... so it is front from the 13th
        ]
    )
    front = choose_front(sessions, ids, act, SYMBOLS, 2024)
    assert front.front_by_session == {day("2024-03-11"): H4, day("2024-03-12"): H4, day("2024-03-13"): M4}
    assert [(r.session, r.from_contract, r.to_contract) for r in front.rolls] == [("2024-03-13", "ESH4", "ESM4")]
    mask = front.mask(sessions, ids)
    assert mask.tolist() == [True, False, True, False, False, True]


def test_first_session_takes_the_nearest_expiry_and_never_rolls_back():
    sessions, ids, act = table(
        [
            ("2024-03-11", M4, 900),
            ("2024-03-11", H4, 10),  # no previous session: nearest expiry (H4)
            ("2024-03-12", M4, 100),
            ("2024-03-12", H4, 900),
            ("2024-03-13", H4, 900),
            ("2024-03-13", M4, 50),  # H4 won the 12th but the front already rolled
        ]
    )
    front = choose_front(sessions, ids, act, SYMBOLS, 2024)
    assert front.front_by_session[day("2024-03-11")] == H4
    assert front.front_by_session[day("2024-03-12")] == M4
    assert front.front_by_session[day("2024-03-13")] == M4  # H4 won the 12th, but no roll back


def test_front_that_stops_trading_moves_to_the_next_expiry():
    sessions, ids, act = table(
        [("2024-03-11", H4, 900), ("2024-03-11", M4, 100), ("2024-03-12", M4, 50), ("2024-03-12", U4, 5)]
    )
    front = choose_front(sessions, ids, act, SYMBOLS, 2024)
    assert front.front_by_session[day("2024-03-12")] == M4


def test_stitch_removes_the_roll_jump_and_keeps_earlier_prices():
    price = np.array([100, 101, 102, 130, 131, 129], dtype=np.int64)
    iid = np.array([H4, H4, H4, M4, M4, M4])
    out = stitch(price, iid)
    assert out.tolist() == [100, 101, 102, 102, 103, 101]
    assert out.dtype == np.int64


def test_roll_in_generated_data_is_recorded(tiny_sidecars):
    for sc in tiny_sidecars["book"] + tiny_sidecars["bars"]:
        assert len(sc.meta.contracts) == 2, sc.meta.contracts
        (roll,) = sc.meta.roll_dates
        first = dt.date.fromisoformat(roll.session)
        assert roll.from_contract[:2] == roll.to_contract[:2] == "ES"
        assert dt.date.fromisoformat(sc.meta.first_time[:10]) <= first
        iid = np.asarray(sc.instrument_id)
        assert (np.diff(iid.astype(np.int64)) != 0).sum() == 1, "one switch of contract per file"
