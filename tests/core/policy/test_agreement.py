"""The per-step agreement's numbers: every rank's report, combined by an element-wise maximum,
decodes to the same agreement on every rank (rank 0 decides; any rank may signal or fail)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autockpt_core.policy.agreement import WIDTH, Agreement, combine, decode, encode
from autockpt_core.policy.rank_timing import RankTimes


def agreed(*reports: dict[str, Any]) -> Agreement:
    return decode(combine([encode(rank, **report) for rank, report in enumerate(reports)]))


@pytest.mark.parametrize(
    "reports, expected",
    [
        ([{}, {}], Agreement(False, False, None, None, RankTimes(0.0, 0.0))),
        # rank 0 decides; the same wish on another rank counts for nothing
        ([{"save": True}, {}], Agreement(True, False, None, None, RankTimes(0.0, 0.0))),
        ([{}, {"save": True, "unclean": True}], Agreement(False, False, None, None, RankTimes(0.0, 0.0))),
        ([{"unclean": True}, {}], Agreement(False, True, None, None, RankTimes(0.0, 0.0))),
        # a signal on any rank; the larger number when two differ
        ([{}, {"signum": 15}], Agreement(False, False, 15, None, RankTimes(0.0, 0.0))),
        ([{"signum": 10}, {"signum": 15}, {}], Agreement(False, False, 15, None, RankTimes(0.0, 0.0))),
        # a failure on any rank: the highest-numbered failed rank
        ([{"failed": True}, {}], Agreement(False, False, None, 0, RankTimes(0.0, 0.0))),
        ([{"failed": True}, {}, {"failed": True}], Agreement(False, False, None, 2, RankTimes(0.0, 0.0))),
        # the slowest rank's figures, each its own maximum
        (
            [{"times": RankTimes(0.5, 0.0)}, {"times": RankTimes(0.25, 2.0)}],
            Agreement(False, False, None, None, RankTimes(0.5, 2.0)),
        ),
    ],
)
def test_reports_combine_into_one_agreement(reports: list[dict[str, Any]], expected: Agreement) -> None:
    assert agreed(*reports) == expected


reports = st.fixed_dictionaries(
    {
        "save": st.booleans(),
        "unclean": st.booleans(),
        "signum": st.one_of(st.none(), st.integers(1, 64)),
        "failed": st.booleans(),
        "times": st.builds(RankTimes, st.floats(0, 1e4), st.floats(0, 1e4)),
    }
)


@given(st.lists(reports, min_size=1, max_size=16))
def test_any_order_of_ranks_agrees_on_what_the_rules_say(ranks: list[dict[str, Any]]) -> None:
    vectors = [encode(rank, **report) for rank, report in enumerate(ranks)]
    result = decode(combine(vectors))
    assert result == decode(combine(list(reversed(vectors))))  # the collective's order does not matter
    assert result.save == ranks[0]["save"] and result.unclean == ranks[0]["unclean"]
    signals = [r["signum"] for r in ranks if r["signum"]]
    assert result.signum == (max(signals) if signals else None)
    failed = [rank for rank, r in enumerate(ranks) if r["failed"]]
    assert result.failed_rank == (max(failed) if failed else None)
    assert result.slowest == RankTimes.slowest([r["times"] for r in ranks])


def test_malformed_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match=f"expected one vector of {WIDTH} numbers per rank"):
        combine([[0.0] * WIDTH, [0.0] * (WIDTH - 1)])
    with pytest.raises(ValueError, match="expected one vector"):
        combine([])
    with pytest.raises(ValueError, match=f"expected {WIDTH} numbers, got 2"):
        decode([0.0, 1.0])
