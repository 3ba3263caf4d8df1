"""autockpt_core.rng: Python and numpy global generators, captured as plain JSON."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from autockpt_core.rng import capture_rng, restore_rng


def draws() -> tuple[float, float, float, float, list[int]]:
    return (
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        float(np.random.randn()),
        list(np.random.permutation(5)),
    )


def test_restore_replays_the_same_draws_and_state_is_json() -> None:
    random.seed(3)
    np.random.seed(3)
    random.gauss(0, 1)  # leaves a cached gauss value in Python's state
    np.random.randn()  # and may leave one in numpy's
    state = json.loads(json.dumps(capture_rng()))  # survives a JSON round trip (Keras metadata)
    first = draws()
    np.random.seed(99)
    random.seed(99)
    restore_rng(state)
    assert draws() == first


def test_restore_rejects_foreign_states_without_changing_anything() -> None:
    before = capture_rng()
    with pytest.raises(ValueError, match="not an autockpt RNG state"):
        restore_rng({"python": 1})
    with pytest.raises(ValueError, match="version"):
        restore_rng({**before, "version": 99})
    assert capture_rng() == before
