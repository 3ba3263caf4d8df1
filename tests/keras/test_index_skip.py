"""autockpt_keras.index_skip: which inputs a resumed epoch skips by index, and the stand-in
dataset's lookups (a fake adapter; the Keras runs are in test_keras_adapter.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
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


# -- a torch DataLoader ------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402


class Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is i (plus noise from torch's generator if ``draws``); notes what it loads."""

    def __init__(self, draws: bool = False, size: int = 12) -> None:
        self.loaded: list[int] = []
        self.draws = draws
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        self.loaded.append(i)
        return torch.tensor(float(i)) + (torch.rand(()) if self.draws else 0.0)


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(4))


def loader_adapter(dataset: Any, **kwargs: Any) -> Any:
    return SimpleNamespace(_dataloader=DataLoader(dataset, batch_size=3, **kwargs))


@pytest.mark.parametrize(
    ("adapter", "by_index", "reason"),
    [
        (loader_adapter(Samples(), shuffle=True), True, ""),
        (loader_adapter(Stream()), False, "IterableDataset"),
    ],
)
def test_which_data_loaders_skip_by_index(adapter: Any, by_index: bool, reason: str) -> None:
    plan = skip_plan(SimpleNamespace(data_adapter=adapter), "torch DataLoader")
    assert plan.by_index is by_index and reason in plan.reason


def batches_of(dataset: Samples, count: int, *, check: bool = False, seed: int = 3) -> tuple[Any, IndexSkip, list]:
    """A shuffled loader over ``dataset`` with its first ``count`` batches skipped; all its batches."""
    adapter = loader_adapter(dataset, shuffle=True)
    loader = adapter._dataloader
    said: list[str] = []
    skip = IndexSkip(adapter, count, check_generators=check, say=said.append)
    skip.install()
    assert adapter._dataloader is not loader and len(adapter._dataloader) == 4  # attributes pass through
    torch.manual_seed(seed)
    batches = [b.tolist() for b in adapter._dataloader]
    assert adapter._dataloader is loader  # put back when its iterator was created
    return skip, batches, said


def uninterrupted(draws: bool = False, seed: int = 3) -> list[list[float]]:
    torch.manual_seed(seed)
    return [b.tolist() for b in DataLoader(Samples(draws), batch_size=3, shuffle=True)]


def test_a_data_loader_skips_by_its_sampler_and_loads_the_rest_as_before() -> None:
    dataset = Samples()
    skip, batches, said = batches_of(dataset, 3)
    whole = uninterrupted()
    assert batches[:3] == [whole[0]] * 3  # the first skipped batch stands in for all three
    assert batches[3:] == whole[3:]  # the sampler's order is the interrupted run's
    assert sorted(dataset.loaded) == sorted(int(v) for v in whole[0] + whole[3])
    assert (skip.served, skip.loaded, skip.remaining, said) == (2, 1, 0, [])


@pytest.mark.parametrize("check", [False, True])
def test_a_dataset_drawing_from_torch_loads_every_skipped_batch_where_checked(check: bool) -> None:
    dataset = Samples(draws=True)
    skip, batches, said = batches_of(dataset, 3, check=check)
    assert len(dataset.loaded) == (12 if check else 6)
    assert (skip.served, skip.loaded) == ((0, 3) if check else (2, 1))
    if check:  # drawn in sequence: every batch is the uninterrupted run's
        assert batches == uninterrupted(draws=True)
        assert len(said) == 1 and "Samples.__getitem__ draws from" in said[0] and "2 other skipped" in said[0]
    else:
        assert said == []


def test_the_shuffle_draw_is_not_taken_for_a_draw_of_the_dataset() -> None:
    dataset = Samples()
    skip, _, said = batches_of(dataset, 3, check=True)
    assert (skip.served, skip.loaded, said) == (2, 1, [])


def test_a_skip_longer_than_the_loader_ends_with_it() -> None:
    skip, batches, _ = batches_of(Samples(), 9)
    assert len(batches) == 4 and skip.remaining == 0 and (skip.served, skip.loaded) == (3, 1)


def test_a_stateful_data_loader_skips_by_index_and_counts_the_skipped_batches() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    torch.manual_seed(3)  # its sampler takes its generator's seed when it is built
    whole = [b.tolist() for b in stateful.StatefulDataLoader(Samples(), batch_size=3, shuffle=True)]
    torch.manual_seed(3)
    adapter = SimpleNamespace(_dataloader=stateful.StatefulDataLoader(Samples(), batch_size=3, shuffle=True))
    skip = IndexSkip(adapter, 2, check_generators=True)
    skip.install()
    iterator = iter(adapter._dataloader)
    batches = [next(iterator).tolist() for _ in range(3)]
    assert batches == [whole[0], whole[0], whole[2]] and (skip.served, skip.loaded) == (1, 1)
    assert adapter._dataloader.state_dict()["_num_yielded"] == 3  # its own resume state counts them


# -- arrays on the torch backend ---------------------------------------------------------------------


class ArrayAdapter:
    """As Keras' ``ArrayDataAdapter`` on torch: ``get_torch_dataloader`` makes a new loader over
    the arrays for each epoch, its batch sampler shuffled by torch's generator, each batch one
    ``__getitems__`` (here: the sample numbers, noted in ``loaded``)."""

    def __init__(self, size: int = 14, batch: int = 3, shuffle: Any = True) -> None:
        self.size, self.batch, self.shuffle = size, batch, shuffle
        self.loaded: list[list[int]] = []
        self.made = 0

    def get_torch_dataloader(self) -> Any:
        adapter = self
        adapter.made += 1

        class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __getitems__(self, indices: list[int]) -> Any:
                adapter.loaded.append(list(indices))
                return torch.tensor(indices, dtype=torch.float32)

            def __len__(self) -> int:
                return adapter.size

        rows = range(self.size)
        sampler: Any = torch.utils.data.RandomSampler(rows) if self.shuffle else torch.utils.data.SequentialSampler(rows)
        batches: Any = torch.utils.data.BatchSampler(sampler, self.batch, drop_last=False)
        if self.shuffle == "batch":  # each batch's order drawn as it is taken
            plain = torch.utils.data.BatchSampler(rows, self.batch, drop_last=False)

            class PerBatch(torch.utils.data.Sampler):  # type: ignore[type-arg]
                def __iter__(self) -> Any:
                    for b in plain:
                        yield [b[i] for i in torch.randperm(len(b))]

                def __len__(self) -> int:
                    return len(plain)

            batches = PerBatch()
        return DataLoader(Rows(), batch_sampler=batches, collate_fn=lambda batch: batch)


def test_arrays_skip_by_index_on_torch_only() -> None:
    iterator = SimpleNamespace(data_adapter=ArrayAdapter())
    assert skip_plan(iterator, "arrays", "torch").by_index
    for backend in ("tensorflow", "jax", ""):
        plan = skip_plan(iterator, "arrays", backend)
        assert not plan.by_index and "slices of memory" in plan.reason
    assert not skip_plan(SimpleNamespace(data_adapter=SimpleNamespace()), "arrays", "torch").by_index


def epochs_of(adapter: ArrayAdapter, epochs: int, seed: int = 5) -> list[list[list[float]]]:
    torch.manual_seed(seed)
    return [[b.tolist() for b in adapter.get_torch_dataloader()] for _ in range(epochs)]


@pytest.mark.parametrize("shuffle", [True, "batch", False])
def test_an_array_epoch_skips_by_its_sampler_and_the_next_loaders_are_keras_own(shuffle: Any) -> None:
    whole = epochs_of(ArrayAdapter(shuffle=shuffle), 2)
    adapter = ArrayAdapter(shuffle=shuffle)
    skip = IndexSkip(adapter, 4, check_generators=False)
    skip.install()
    assert "get_torch_dataloader" in vars(adapter)
    resumed = epochs_of(adapter, 2)
    assert "get_torch_dataloader" not in vars(adapter)  # the class's method again, once the loader was made
    assert resumed[0][:4] == [whole[0][0]] * 4  # the first skipped batch stands in for all four
    assert resumed[0][4:] == whole[0][4:] and resumed[1] == whole[1]  # the sampler drew as before
    assert adapter.loaded[0] == [int(v) for v in whole[0][0]] and len(adapter.loaded) == 1 + 1 + 5
    assert (skip.served, skip.loaded, skip.remaining, adapter.made) == (3, 1, 0, 2)


def test_an_adapter_whose_loader_method_was_replaced_gets_that_back() -> None:
    adapter = ArrayAdapter()
    own = adapter.get_torch_dataloader
    adapter.get_torch_dataloader = own  # type: ignore[method-assign]  # an attribute of the instance
    skip = IndexSkip(adapter, 2, check_generators=False)
    skip.install()
    skip.uninstall()
    assert adapter.get_torch_dataloader is own


# -- a torch DataLoader with workers ---------------------------------------------------------------


class Logged(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is i (plus torch noise if ``draws``); every load, in any process, is appended to
    ``log`` as "pid index"; ``main_only``: a load outside a worker fails."""

    def __init__(self, log: Any, *, draws: bool = False, main_only: bool = False, size: int = 24) -> None:
        self.log, self.draws, self.main_only, self.size = str(log), draws, main_only, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        if self.main_only and torch.utils.data.get_worker_info() is None:
            raise RuntimeError("opened by worker_init_fn only")
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {i}\n")
        return torch.tensor(float(i)) + (torch.rand(()) if self.draws else 0.0)


def worker_loader(dataset: Any, **kwargs: Any) -> Any:
    return DataLoader(dataset, batch_size=3, shuffle=True, num_workers=2, **kwargs)


def loads(log: Any) -> list[tuple[bool, int]]:
    """(loaded in this process, index) per load logged."""
    lines = Path(log).read_text().split() if Path(log).exists() else []
    return [(int(pid) == os.getpid(), int(i)) for pid, i in zip(lines[::2], lines[1::2])]


def worker_batches(dataset: Any, count: int, *, epochs: int = 1, seed: int = 3, **kwargs: Any) -> Any:
    """A shuffled loader with 2 workers over ``dataset``, its first ``count`` batches skipped;
    every epoch's batches and torch's generator at the end."""
    adapter = SimpleNamespace(_dataloader=worker_loader(dataset, **kwargs))
    said: list[str] = []
    skip = IndexSkip(adapter, count, check_generators=False, say=said.append)
    skip.install()
    torch.manual_seed(seed)
    batches = [[b.tolist() for b in adapter._dataloader] for _ in range(epochs)]
    return skip, batches, said, torch.get_rng_state()


def worker_whole(dataset: Any, *, epochs: int = 1, seed: int = 3, **kwargs: Any) -> Any:
    loader = worker_loader(dataset, **kwargs)
    torch.manual_seed(seed)
    return [[b.tolist() for b in loader] for _ in range(epochs)], torch.get_rng_state()


@pytest.mark.parametrize(
    ("kwargs", "by_index", "reason"),
    [
        ({}, True, ""),
        ({"worker_init_fn": lambda worker: None}, False, "worker_init_fn"),
    ],
)
def test_a_data_loader_with_workers_skips_by_index_without_a_worker_init_fn(
    kwargs: dict[str, Any], by_index: bool, reason: str
) -> None:
    plan = skip_plan(SimpleNamespace(data_adapter=loader_adapter(Samples(), num_workers=2, **kwargs)), "torch DataLoader")
    assert plan.by_index is by_index and reason in plan.reason


def test_a_stateful_data_loader_with_workers_is_drawn() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    adapter = SimpleNamespace(_dataloader=stateful.StatefulDataLoader(Samples(), batch_size=3, num_workers=2))
    plan = skip_plan(SimpleNamespace(data_adapter=adapter), "torch DataLoader")
    assert not plan.by_index and "StatefulDataLoader with workers" in plan.reason


def test_no_worker_loads_a_skipped_batch_and_the_rest_is_the_interrupted_runs(tmp_path: Path) -> None:
    skip, (batches,), said, rng = worker_batches(Logged(tmp_path / "skip.log"), 5)
    (whole,), whole_rng = worker_whole(Logged(tmp_path / "whole.log"))
    assert batches[:5] == [whole[0]] * 5 and batches[5:] == whole[5:]
    assert torch.equal(rng, whole_rng)  # the sampler and the workers' base seed drew as before
    skipped = {int(v) for b in whole[1:5] for v in b}
    done = loads(tmp_path / "skip.log")
    assert sorted(i for here, i in done if here) == sorted(int(v) for v in whole[0])  # the stand-in, loaded here
    assert not skipped & {i for here, i in done if not here}  # no worker loaded a skipped batch
    assert (skip.served, skip.loaded, skip.remaining, said) == (4, 1, 0, [])


@pytest.mark.parametrize("case", ["draws", "main_only"])
def test_a_dataset_that_draws_or_loads_only_in_workers_has_every_batch_loaded_by_them(
    tmp_path: Path, case: str
) -> None:
    flags = {case: True}
    skip, (batches,), said, rng = worker_batches(Logged(tmp_path / "skip.log", **flags), 5)
    (whole,), whole_rng = worker_whole(Logged(tmp_path / "whole.log", **flags))
    assert batches == whole and torch.equal(rng, whole_rng)  # in sequence: the probe's draws were put back
    assert (skip.served, skip.loaded, skip.remaining) == (0, 5, 0)
    why = "draws from Python's, numpy's or torch's global generator" if case == "draws" else "RuntimeError"
    assert len(said) == 1 and why in said[0] and "workers load the 5 skipped batch(es)" in said[0], said


def test_persistent_workers_skip_the_first_epoch_only(tmp_path: Path) -> None:
    skip, batches, said, rng = worker_batches(Logged(tmp_path / "skip.log"), 4, epochs=2, persistent_workers=True)
    whole, whole_rng = worker_whole(Logged(tmp_path / "whole.log"), epochs=2, persistent_workers=True)
    assert batches[0][:4] == [whole[0][0]] * 4 and batches[0][4:] == whole[0][4:]
    assert batches[1] == whole[1] and torch.equal(rng, whole_rng)
    assert (skip.served, skip.loaded, said) == (3, 1, [])


def test_a_skip_longer_than_a_loader_with_workers_ends_with_it(tmp_path: Path) -> None:
    skip, (batches,), _, _ = worker_batches(Logged(tmp_path / "skip.log", size=9), 7)
    assert len(batches) == 3 and skip.remaining == 0 and (skip.served, skip.loaded) == (2, 1)
