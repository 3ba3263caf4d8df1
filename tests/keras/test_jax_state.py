"""autockpt_keras/jax_state.py: the step of a JAX fit() read without reattaching its state."""

from __future__ import annotations

from typing import Any

import numpy as np


class _Variable:
    def __init__(self, value: int) -> None:
        self.value = value

    def numpy(self) -> np.ndarray:
        return np.asarray(self.value)


class _Optimizer:
    def __init__(self) -> None:
        self.iterations = _Variable(0)  # what a detached (purged) variable reads: its initial value
        self.variables = [_Variable(-1), self.iterations, _Variable(-2)]


class _Model:
    def __init__(self, state: dict[str, Any] | None, synced: bool) -> None:
        self.optimizer = _Optimizer()
        self._jax_state = state
        self._jax_state_synced = synced
        self.syncs = 0

    def jax_state_sync(self) -> None:
        self.syncs += 1
        self.optimizer.iterations.value = 99
        self._jax_state_synced = True


def test_the_step_comes_from_the_detached_state_without_a_sync() -> None:
    from autockpt_keras.jax_state import optimizer_step

    model = _Model({"optimizer_variables": [np.int64(-1), np.int64(7), np.int64(-2)]}, synced=False)
    assert optimizer_step(model) == 7 and model.syncs == 0


def test_the_variable_is_read_when_fit_holds_no_detached_state() -> None:
    from autockpt_keras.jax_state import optimizer_step

    for state, synced in ((None, False), ({"optimizer_variables": [1, 2, 3]}, True)):
        model = _Model(state, synced)
        model.optimizer.iterations.value = 5
        assert optimizer_step(model) == 5 and model.syncs == 0


def test_an_unknown_layout_reattaches_the_state_then_reads_the_variable() -> None:
    from autockpt_keras.jax_state import optimizer_step

    model = _Model({"optimizer_variables": [np.int64(7)]}, synced=False)  # iterations not among them
    assert optimizer_step(model) == 99 and model.syncs == 1
