"""autockpt_keras.index_skip: which inputs a resumed epoch skips by index, and the stand-in
dataset's lookups (a fake adapter; the Keras runs are in test_keras_adapter.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from autockpt_keras.index_skip import IndexSkip, skip_plan


class Dataset:
    """Notes the indices it loads; ``draws``: each load draws from numpy's global generator."""

    def __init__(self, draws: bool = False) -> None:
        self.loaded: list[int] = []
        self.draws = draws
        self.num_batches = 10

    def __getitem__(self, i: int) -> tuple[int, float]:
        self.loaded.append(i)
        return i, float(np.random.random()) if self.draws else 0.0

    def on_epoch_begin(self) -> None:
        self.began = True


def epoch_iterator(*, py_dataset: Any = None, enqueuer: Any = None) -> Any:
    adapter = SimpleNamespace(py_dataset=py_dataset, enqueuer=enqueuer) if py_dataset is not None else SimpleNamespace()
    return SimpleNamespace(data_adapter=adapter)


@pytest.mark.parametrize(
    ("kind", "iterator", "by_index", "reason"),
    [
        ("PyDataset", epoch_iterator(py_dataset=Dataset()), True, ""),
        ("PyDataset", epoch_iterator(py_dataset=Dataset(), enqueuer=object()), False, "with workers"),
        ("PyDataset", None, False, "PyDataset input"),
        ("arrays", epoch_iterator(), False, "slices of memory"),
        ("tf.data", epoch_iterator(), False, "cannot jump ahead"),
        ("torch DataLoader", epoch_iterator(), False, "its own iterator"),
        ("generator", epoch_iterator(), False, "only be drawn"),
        ("unknown", None, False, "unknown input"),
    ],
)
def test_which_inputs_skip_by_index(kind: str, iterator: Any, by_index: bool, reason: str) -> None:
    plan = skip_plan(iterator, kind)
    assert plan.by_index is by_index and reason in plan.reason
    said = plan.describe(8)
    assert ("by index" in said) is by_index and "8 batch(es)" in said


def installed(count: int, *, check: bool = False, draws: bool = False) -> tuple[Any, Dataset, IndexSkip, list[str]]:
    dataset = Dataset(draws)
    adapter = SimpleNamespace(py_dataset=dataset)
    said: list[str] = []
    skip = IndexSkip(adapter, count, check_generators=check, say=said.append)
    skip.install()
    return adapter, dataset, skip, said


def test_the_skipped_lookups_load_one_batch_then_the_dataset_is_back() -> None:
    adapter, dataset, skip, said = installed(4)
    assert adapter.py_dataset is not dataset and adapter.py_dataset.num_batches == 10  # attributes pass through
    adapter.py_dataset.on_epoch_begin()
    assert dataset.began
    answers = [adapter.py_dataset[i] for i in (7, 2, 5, 0)]
    assert dataset.loaded == [7] and answers == [(7, 0.0)] * 4  # the first skipped batch stands in for all
    assert adapter.py_dataset is dataset  # put back after the 4th lookup
    assert adapter.py_dataset[3] == (3, 0.0) and dataset.loaded == [7, 3]
    assert (skip.served, skip.loaded, said) == (3, 1, [])


def test_a_skip_of_nothing_installs_nothing() -> None:
    adapter, dataset, _, _ = installed(0)
    assert adapter.py_dataset is dataset


def test_uninstall_before_the_end_puts_the_dataset_back() -> None:
    adapter, dataset, skip, _ = installed(5)
    adapter.py_dataset[1]
    skip.uninstall()
    assert adapter.py_dataset is dataset


@pytest.mark.parametrize("check", [False, True])
def test_draws_from_numpy_load_every_skipped_batch_where_checked(check: bool) -> None:
    adapter, dataset, skip, said = installed(3, check=check, draws=True)
    for i in (4, 8, 1):
        adapter.py_dataset[i]
    assert dataset.loaded == ([4, 8, 1] if check else [4])
    assert (skip.served, skip.loaded) == ((0, 3) if check else (2, 1))
    if check:
        assert len(said) == 1 and "Dataset.__getitem__ draws from" in said[0] and "2 other skipped" in said[0]
    else:
        assert said == []


def test_a_dataset_that_does_not_draw_is_served_where_checked() -> None:
    adapter, dataset, skip, said = installed(3, check=True)
    for i in (4, 8, 1):
        adapter.py_dataset[i]
    assert dataset.loaded == [4] and (skip.served, skip.loaded, said) == (2, 1, [])


def test_lookups_from_two_threads_skip_exactly_count() -> None:
    adapter, dataset, skip, _ = installed(50)
    lookup = adapter.py_dataset

    def look() -> None:
        for i in range(40):
            lookup[i]

    threads = [threading.Thread(target=look) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert skip.served + skip.loaded == 50 and len(dataset.loaded) == 1 + 30
