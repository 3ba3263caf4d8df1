"""What a Keras resume pays to skip the batches its epoch already trained.

A checkpoint is taken at batch ``--at`` of a ``--batches``-batch epoch; then ``--rounds``
resumed fits from it, each input and skip mode in turn, time the skip: from the resumed
epoch's ``on_epoch_begin`` to the ``on_train_batch_begin`` of its first trained batch.
Inputs: a shuffled ``PyDataset`` whose ``__getitem__`` reads its batch from a ``.npy`` file
(``--batch`` rows of ``--features`` float32, in the page cache after the first epoch) and
normalizes it, skipped by index (the default) or drawn (every skipped batch loaded, as before
the index skip); a shuffled torch ``DataLoader`` whose dataset reads each sample from the
memory-mapped ``.npy`` of all the data and normalizes it, without workers and with
``--workers`` worker processes, by index or drawn; and the same data as numpy arrays
(``fit(shuffle=True)``), by index (torch backend) or drawn.
Prints a table and writes ``--json``.

    python examples/keras_resume_skip.py --backend torch --batches 400 --at 390 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keras_example_setup import use_backend


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["jax", "tensorflow", "torch"])
    parser.add_argument("--batches", type=int, default=400, help="batches per epoch")
    parser.add_argument("--at", type=int, default=390, help="the checkpoint's batch: the resume skips this many")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=3072)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the second DataLoader (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


ARGS = _parse(sys.argv[1:] if __name__ == "__main__" else [])
use_backend(ARGS.backend)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autockpt_keras.exact_resume as exact_resume  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402
from autockpt_keras.index_skip import SkipPlan  # noqa: E402


class FileBatches(keras.utils.PyDataset):
    """Batch i is read from ``batch-i.npy`` and normalized."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __len__(self) -> int:
        return ARGS.batches

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.load(self.folder / f"batch-{i}.npy")
        x = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
        return x, x[:, :1]


def torch_loader(path: Path, workers: int = 0) -> Any:
    """A shuffled DataLoader over the samples of ``path`` (memory-mapped), each normalized,
    loaded by ``workers`` worker processes (0: in the training process)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class FileSamples(Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.x = np.load(path, mmap_mode="r")

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x = np.asarray(self.x[i])
            x = (x - x.mean()) / (x.std() + 1e-6)
            return torch.from_numpy(x), torch.from_numpy(x[:1])

    torch.manual_seed(0)
    return DataLoader(FileSamples(), batch_size=ARGS.batch, shuffle=True, num_workers=workers)


class SkipTimer(keras.callbacks.Callback):
    """After AutoCheckpoint: the resumed epoch's start to its first trained batch."""

    def __init__(self) -> None:
        super().__init__()
        self.began = 0.0
        self.skip_s: float | None = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.began = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if batch == ARGS.at and self.skip_s is None:
            self.skip_s = time.perf_counter() - self.began


def make_model() -> keras.Model:
    keras.utils.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((ARGS.features,), name="x"), keras.layers.Dense(32, name="hidden"), keras.layers.Dense(1, name="out")],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3, name="adam"), loss="mse")
    return model


def fit(data: Any, dirpath: Path, **kwargs: Any) -> SkipTimer:
    model = make_model()
    auto = AutoCheckpoint(dirpath, every_n_steps=ARGS.at, save_on_train_end=False, verbose=False)
    timer = SkipTimer()
    model.fit(*data, epochs=1, verbose=0, callbacks=[auto, timer], shuffle=True, **kwargs)
    return timer


def forced_draw(epoch_iterator: Any, kind: str, backend: str = "") -> SkipPlan:
    return SkipPlan(False, "forced by the benchmark")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="resume-skip-"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ARGS.batches * ARGS.batch, ARGS.features)).astype("float32")
    for i in range(ARGS.batches):
        np.save(work / f"batch-{i}.npy", x[i * ARGS.batch : (i + 1) * ARGS.batch])
    np.save(work / "all.npy", x)
    inputs = {
        "pydataset": ((FileBatches(work),), {}),
        "dataloader": ((torch_loader(work / "all.npy"),), {}),
        "arrays": ((x, x[:, :1]), {"batch_size": ARGS.batch}),
    }
    if ARGS.workers:
        inputs[f"dataloader, {ARGS.workers} workers"] = ((torch_loader(work / "all.npy", ARGS.workers),), {})
    folders = {name: work / name.replace(", ", "-").replace(" ", "-") for name in inputs}
    for name, (data, kwargs) in inputs.items():  # one checkpoint at batch --at, nothing at the end
        fit(data, folders[name], **kwargs)
    cases = [("pydataset", "by index"), ("pydataset", "drawn"), ("dataloader", "by index"), ("dataloader", "drawn"),
             ("arrays", "drawn")]
    if ARGS.backend == "torch":  # arrays skip by index on torch only
        cases.insert(4, ("arrays", "by index"))
    if ARGS.workers:
        cases += [(f"dataloader, {ARGS.workers} workers", "by index"), (f"dataloader, {ARGS.workers} workers", "drawn")]
    times: dict[str, list[float]] = {f"{i}, {m}": [] for i, m in cases}
    real_plan = exact_resume.skip_plan
    for _ in range(ARGS.rounds):
        for input_name, mode in cases:
            exact_resume.skip_plan = real_plan if mode == "by index" else forced_draw  # type: ignore[assignment]
            data, kwargs = inputs[input_name]
            timer = fit(data, folders[input_name], **kwargs)
            assert timer.skip_s is not None, "the resumed epoch did not reach the checkpoint's batch"
            times[f"{input_name}, {mode}"].append(timer.skip_s)
    exact_resume.skip_plan = real_plan
    print(f"Keras {keras.__version__} on {ARGS.backend}: skip of {ARGS.at} batches of {ARGS.batch}x{ARGS.features} "
          f"float32 ({ARGS.rounds} rounds, median (min-max))")
    print("| input, skip | skip s |")
    print("|---|---|")
    for case, values in times.items():
        print(f"| {case} | {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}) |")
    if ARGS.json:
        result = {"args": vars(ARGS), "keras": keras.__version__, "python": platform.python_version(),
                  "machine": platform.machine(), "cpus": os.cpu_count(), "skip_s": times}
        Path(ARGS.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
