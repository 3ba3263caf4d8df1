"""Young and Daly against their closed forms (property tests) and Daly's worked values."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autockpt_core import Estimates, IntervalRules, choose_interval, daly_interval, young_interval

MIN, HOUR = 60.0, 3600.0
seconds = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(cost=seconds, mtbf=seconds)
def test_young_is_its_closed_form(cost: float, mtbf: float) -> None:
    assert young_interval(cost, mtbf) == pytest.approx(math.sqrt(2 * cost * mtbf), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(cost=seconds, mtbf=seconds)
def test_daly_is_its_closed_form(cost: float, mtbf: float) -> None:
    if cost >= 2 * mtbf:
        expected = mtbf
    else:
        r = cost / (2 * mtbf)
        expected = math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - cost
    assert daly_interval(cost, mtbf) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(cost=st.floats(1e-3, 1e3), ratio=st.floats(1e3, 1e8))
def test_daly_tends_to_young_when_failures_are_rare(cost: float, ratio: float) -> None:
    mtbf = cost * ratio
    assert daly_interval(cost, mtbf) / young_interval(cost, mtbf) == pytest.approx(1.0, abs=2 / math.sqrt(ratio))


@pytest.mark.parametrize(
    ("mtbf", "minutes", "tol"),
    [(24 * HOUR, 117.0, 0.5), (6 * HOUR, 57.0, 0.5), (15 * MIN, 9.1, 0.05)],  # Daly 2006, delta = 5 min
)
def test_daly_worked_values(mtbf: float, minutes: float, tol: float) -> None:
    assert daly_interval(5 * MIN, mtbf) / MIN == pytest.approx(minutes, abs=tol)


@settings(max_examples=100, deadline=None)
@given(
    t=st.floats(1e-3, 10.0),
    stall=st.floats(1e-3, 100.0),
    persist=st.floats(0.0, 600.0),
    mtbf=st.one_of(st.none(), st.floats(60.0, 1e7)),
    budget=st.floats(0.005, 0.5),
)
def test_choice_is_daly_but_never_denser_than_the_bounds(t, stall, persist, mtbf, budget) -> None:
    choice = choose_interval(IntervalRules(budget=budget, mtbf=mtbf), Estimates(iter_time_s=t, stall_s=stall, persist_s=persist))
    c = choice.candidates
    floor = max(c["budget"], c["persist"])
    assert choice.steps == max(floor, c.get("daly", 0))
    assert choice.rule == ("daly" if c.get("daly", 0) >= floor else max(("budget", "persist"), key=c.__getitem__))
    assert stall / (choice.steps * t) <= budget + 1e-9


def test_background_slowdown_counts_as_checkpoint_cost() -> None:
    # persist 2 s during which iterations run 50% slower: 2 * 0.5 / 1.5 = 0.667 s extra per checkpoint
    est = Estimates(iter_time_s=0.1, stall_s=0.1, persist_s=2.0, loaded_iter_time_s=0.15, loaded_iterations=13,
                    loaded_sd_s=0.0)
    assert est.checkpoint_cost_s == pytest.approx(0.1 + 2.0 / 3)
    choice = choose_interval(IntervalRules(budget=0.02), est)
    assert choice.rule == "budget" and choice.steps == math.ceil((0.1 + 2.0 / 3) / (0.02 * 0.1))
    assert choice.cost_s == pytest.approx(est.checkpoint_cost_s)
    assert "cost 0.767s per checkpoint" in choice.explain()


@pytest.mark.parametrize(
    ("loaded", "sd", "cost"),
    [
        (0, None, 0.1 + 2.0),  # nothing measured: the whole persist time, as if training stood still
        (2, 0.0, 0.1 + 2.0),  # too few loaded iterations to trust
        (3, 0.0, 0.1 + 2.0 / 3),  # measured, no spread: the mean slowdown (50%)
        # spread: the upper 95% bound of the slowdown, 0.15 + 4.303 * 0.03 / sqrt(3) -> 124.5%
        (3, 0.03, 0.1 + 2.0 * (0.15 + 4.303 * 0.03 / math.sqrt(3) - 0.1) / (0.15 + 4.303 * 0.03 / math.sqrt(3))),
    ],
)
def test_the_first_cost_is_bounded_from_above_until_the_slowdown_is_measured(loaded, sd, cost) -> None:
    est = Estimates(iter_time_s=0.1, stall_s=0.1, persist_s=2.0, loaded_iter_time_s=0.15 if loaded else None,
                    loaded_iterations=loaded, loaded_sd_s=sd)
    assert est.checkpoint_cost_s == pytest.approx(cost, rel=1e-3)
    assert est.checkpoint_cost_s >= 0.1 + est.background_cost_s  # never below the mean estimate
    assert est.checkpoint_cost_s <= 0.1 + 2.0  # never above the serial bound


@pytest.mark.parametrize("hook_s", [None, 0.0001, 0.001])
def test_the_budget_is_the_checkpoints_whatever_the_hooks_cost(hook_s) -> None:
    """A 2% budget on a 1.6 ms step with a 3 ms stall (a persist measured to slow no step):
    3 ms / (2% x 1.6 ms) = 94 steps, whatever autockpt's own hooks take of each step."""
    est = Estimates(iter_time_s=0.0016, stall_s=0.003, persist_s=0.05, loaded_iter_time_s=0.0016,
                    loaded_iterations=30, loaded_sd_s=0.0, hook_s=hook_s)  # fmt: skip
    choice = choose_interval(IntervalRules(budget=0.02), est)
    assert choice.rule == "budget" and choice.steps == math.ceil(0.003 / (0.02 * 0.0016)) == 94
    assert choice.steps <= 150


@pytest.mark.parametrize(
    ("mtbf", "rule", "steps"),
    [
        # Daly at the measured 3 ms, not the whole 50 ms persist the budget bound starts from
        (20.0, "daly", round(daly_interval(0.003, 20.0) / 0.0016)),
        # the measured cost at Daly's 48 steps would exceed the budget: the budget bound at that cost
        (1.0, "budget", 94),
    ],
)
def test_with_an_mtbf_daly_at_the_measured_cost_unless_it_exceeds_the_budget(mtbf, rule, steps) -> None:
    est = Estimates(iter_time_s=0.0016, stall_s=0.003, persist_s=0.05)  # no loaded step measured yet
    assert choose_interval(IntervalRules(budget=0.02), est).steps == math.ceil(0.053 / (0.02 * 0.0016))
    choice = choose_interval(IntervalRules(budget=0.02, mtbf=mtbf), est)
    assert (choice.rule, choice.steps) == (rule, steps)
