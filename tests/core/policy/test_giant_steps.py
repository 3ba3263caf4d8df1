import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autockpt_core.policy.giant_steps import GiantRates, binomial_tail, is_giant


@pytest.mark.parametrize(
    "seconds, typical, giant",
    [(0.6, 0.1, True), (0.5, 0.1, False), (0.3, 0.1, False), (9.0, None, False), (9.0, 0.0, False)],
)
def test_a_giant_is_over_five_typical_steps(seconds: float, typical: float | None, giant: bool) -> None:
    assert is_giant(seconds, typical) is giant


@pytest.mark.parametrize(
    "k, n, p, tail",
    [(5, 10, 0.5, 0.623046875), (0, 10, 0.3, 1.0), (11, 10, 0.3, 0.0), (1, 10, 0.0, 0.0), (3, 3, 1.0, 1.0),
     (1, 120, 1 / 902, 1 - (901 / 902) ** 120)],
)
def test_binomial_tail_known_values(k: int, n: int, p: float, tail: float) -> None:
    assert binomial_tail(k, n, p) == pytest.approx(tail)


@given(st.integers(0, 60), st.integers(0, 60), st.floats(0.001, 0.999))
def test_binomial_tail_is_the_sum_of_the_upper_terms(k: int, n: int, p: float) -> None:
    direct = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)) if k <= n else 0.0
    assert binomial_tail(k, n, p) == pytest.approx(min(1.0, direct), abs=1e-9)


@pytest.mark.parametrize(
    "clean, clean_giants, loaded, loaded_giants, caused",
    [
        (900, 0, 120, 0, False),  # no giant at all
        (900, 0, 120, 1, False),  # one stall during a persist: chance could give it (p ≈ 12%)
        (900, 0, 120, 2, True),  # two: chance gives that under 1% of the time
        (900, 9, 100, 1, False),  # as frequent among clean steps as among loaded ones
        (900, 9, 100, 8, True),  # eight times as frequent
        (50, 0, 20, 2, False),  # few clean steps: their rate is not known to be low
        (50, 0, 20, 3, True),
    ],
)
def test_giants_count_as_the_checkpoints_once_clearly_more_frequent_among_loaded_steps(
    clean: int, clean_giants: int, loaded: int, loaded_giants: int, caused: bool
) -> None:
    rates = GiantRates()
    for _ in range(clean - clean_giants):
        rates.count(False, False)
    for _ in range(clean_giants):
        rates.count(False, True)
    for _ in range(loaded - loaded_giants):
        rates.count(True, False)
    for _ in range(loaded_giants):
        rates.count(True, True)
    assert rates.checkpoint_caused() is caused
    assert rates.giants == clean_giants + loaded_giants


def test_a_step_taken_back_is_no_longer_counted() -> None:
    rates = GiantRates()
    rates.count(True, True)
    rates.count(True, True, -1)
    assert rates == GiantRates()
