"""autockpt_keras/state.py: per-device copies of distributed variables, with stand-in variables
(the real MirroredStrategy runs in test_keras_faults.py, which needs logical devices set up
before TensorFlow starts)."""

from __future__ import annotations

from typing import Any

import numpy as np

from autockpt_keras.state import REPLICA, ReplicaCopy, StateEntry, assign_state, replica_copies


class _Component:
    def __init__(self, value: np.ndarray) -> None:
        self.array = value.copy()
        self.shape = value.shape

    def numpy(self) -> np.ndarray:
        return self.array

    def assign(self, value: Any) -> None:
        self.array = np.asarray(value).copy()


class _Distributed:  # what a tf.distribute variable offers: its per-device components
    def __init__(self, *components: _Component) -> None:
        self.values = components


class _Variable:
    def __init__(self, shape: tuple[int, ...], trainable: bool, devices: int = 1) -> None:
        self.shape, self.trainable = shape, trainable
        self.assigned: np.ndarray | None = None
        components = tuple(_Component(np.zeros(shape, "float32")) for _ in range(devices))
        self.value = _Distributed(*components) if devices > 1 else components[0]

    def assign(self, value: Any) -> None:  # like a mirrored assign: every device's copy
        self.assigned = np.asarray(value)
        for c in getattr(self.value, "values", (self.value,)):
            c.assign(value)


def _entries(devices: int) -> tuple[list[StateEntry], _Variable, _Variable]:
    kernel, stats = _Variable((2,), trainable=True, devices=devices), _Variable((2,), trainable=False, devices=devices)
    entries = [StateEntry("model/kernel", "model", kernel), StateEntry("model/stats", "model", stats)]
    entries += [StateEntry(f"model/stats{REPLICA}{i}", "model", c) for i, c in enumerate(replica_copies(stats))]
    return entries, kernel, stats


def test_only_non_trainable_distributed_variables_get_per_device_copies() -> None:
    assert replica_copies(_Variable((2,), trainable=True, devices=2)) == []
    assert replica_copies(_Variable((2,), trainable=False, devices=1)) == []
    copies = replica_copies(_Variable((3,), trainable=False, devices=2))
    assert [type(c) for c in copies] == [ReplicaCopy, ReplicaCopy] and copies[0].shape == (3,)


def test_each_device_gets_its_own_copy_back() -> None:
    entries, kernel, stats = _entries(devices=2)
    arrays = {"model/kernel": np.ones(2, "float32"), "model/stats": np.full(2, 5.0, "float32"),
              f"model/stats{REPLICA}0": np.full(2, 4.0, "float32"), f"model/stats{REPLICA}1": np.full(2, 6.0, "float32")}
    report = assign_state(entries, arrays)
    assert report.assigned == 4 and report.skipped == ()
    assert [float(c.array[0]) for c in stats.value.values] == [4.0, 6.0]  # after the variable's own assign
    assert kernel.assigned is not None and float(kernel.assigned[0]) == 1.0


def test_copies_of_another_device_count_are_skipped_and_the_rest_restored() -> None:
    entries, kernel, stats = _entries(devices=1)  # resumed on one device
    arrays = {"model/kernel": np.ones(2, "float32"), "model/stats": np.full(2, 5.0, "float32"),
              f"model/stats{REPLICA}0": np.full(2, 4.0, "float32"), f"model/stats{REPLICA}1": np.full(2, 6.0, "float32")}
    report = assign_state(entries, arrays)
    assert report.assigned == 2
    assert report.skipped == (f"model/stats{REPLICA}0", f"model/stats{REPLICA}1")
    assert stats.assigned is not None and float(stats.assigned[0]) == 5.0
