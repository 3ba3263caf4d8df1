"""One tiny fit per adapter behind the same interface, for the contract suite (test_contract.py).

:class:`LightningFits` and :class:`KerasFits` train a small MLP regressor on fixed data of
``batches`` batches of 8 per epoch for ``epochs`` epochs, in this process (Keras on its
default TensorFlow backend), with ``AutoCheckpoint`` first in the callbacks.
``nonfinite_last_batch`` (NaN or inf) becomes the targets of the data's last batch, so with one
epoch only the loss of the fit's last step is non-finite. Frameworks are imported on first
use, so a test of one adapter does not import the other's.

For the subprocess tests each also names its fault-harness script (``tests/fault/``) and the
arguments that make both scripts train the same schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from autockpt_core.run_status import read_status

BATCH = 8
FEATURES = 8


@dataclasses.dataclass
class FitResult:
    """What one ``fit()`` did, in the same terms for both adapters."""

    callback: Any
    start_step: int  # the optimizer step training started from (after a resume)
    end_step: int  # the optimizer step when fit() returned
    event_steps: list[int]  # steps of the checkpoints this callback took (its CheckpointEvents)
    event_reasons: list[str]
    event_epochs: list[int]
    warnings: list[warnings.WarningMessage]  # every warning raised during fit()
    statuses: list[dict[str, Any] | None]  # dirpath's status file after each batch (None: none yet)


def _data(batches: int, nonfinite_last_batch: float | None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH, FEATURES)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(len(x), 1))).astype("float32")
    if nonfinite_last_batch is not None:
        y[-BATCH:] = nonfinite_last_batch
    return x, y


class LightningFits:
    """``autockpt_lightning`` on the helpers of tests/lightning (TinyModel, make_trainer)."""

    name = "lightning"
    script = [sys.executable, "-m", "tests.fault.lightning_script"]
    script_args = ["--loader", "stateful"]

    @property
    def module(self) -> Any:
        import autockpt_lightning

        return autockpt_lightning

    def fit(
        self, dirpath: Path, epochs: int, batches: int = 5, *, nonfinite_last_batch: float | None = None, **callback_kwargs: Any
    ) -> FitResult:
        import lightning.pytorch as pl
        import torch
        from torch.utils.data import TensorDataset
        from torchdata.stateful_dataloader import StatefulDataLoader

        from tests.lightning.lightning_helpers import TinyModel, make_trainer

        torch.set_num_threads(1)

        class Count(pl.Callback):
            def __init__(self) -> None:
                self.start: int | None = None

            def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
                self.start = trainer.global_step

            def on_train_batch_end(self, *args: Any) -> None:
                statuses.append(read_status(dirpath))

        x, y = _data(batches, nonfinite_last_batch)
        statuses: list[dict[str, Any] | None] = []
        torch.manual_seed(0)
        auto = self.module.AutoCheckpoint(dirpath, **callback_kwargs)
        count = Count()
        trainer = make_trainer(
            dirpath.parent, [auto, count], max_steps=-1, max_epochs=epochs, enable_checkpointing=False
        )
        with recording() as caught:
            warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata's, not ours
            loader = StatefulDataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=BATCH)
            trainer.fit(TinyModel(), train_dataloaders=loader)
        start = count.start if count.start is not None else trainer.global_step  # None: no epoch left
        return _result(auto, start, trainer.global_step, caught, statuses)


class KerasFits:
    """``autockpt_keras`` on the default (TensorFlow) backend: a Dense model, ``fit()`` on arrays."""

    name = "keras"
    script = [sys.executable, "-m", "tests.fault.keras_script"]
    script_args = ["--backend", "tensorflow", "--inputs", "arrays"]

    @property
    def module(self) -> Any:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import keras

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            try:
                tf.config.threading.set_intra_op_parallelism_threads(1)
                tf.config.threading.set_inter_op_parallelism_threads(1)
            except RuntimeError:  # TensorFlow is already initialized (an earlier test)
                pass
        import autockpt_keras

        return autockpt_keras

    def fit(
        self, dirpath: Path, epochs: int, batches: int = 5, *, nonfinite_last_batch: float | None = None, **callback_kwargs: Any
    ) -> FitResult:
        module = self.module
        import keras

        class Count(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.start: int | None = None

            def on_train_begin(self, logs: Any = None) -> None:
                self.start = int(self.model.optimizer.iterations.numpy())

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                statuses.append(read_status(dirpath))

        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((FEATURES,), name="x"),
                keras.layers.Dense(16, activation="relu", name="hidden"),
                keras.layers.Dense(1, name="out"),
            ],
            name="net",
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01, name="adam"), loss="mse")
        x, y = _data(batches, nonfinite_last_batch)
        statuses: list[dict[str, Any] | None] = []
        auto = module.AutoCheckpoint(dirpath, **callback_kwargs)
        count = Count()
        with recording() as caught:
            model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[auto, count])
        end = int(model.optimizer.iterations.numpy())
        return _result(auto, count.start if count.start is not None else end, end, caught, statuses)


@contextlib.contextmanager
def recording() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning (none deduplicated), but keep autockpt's own DeprecationWarnings
    errors, as pyproject.toml's filterwarnings makes them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", category=DeprecationWarning, module=r"autockpt_(core|torch|lightning|keras)(\..*)?$")
        yield caught


def _result(auto: Any, start: int, end: int, caught: list[warnings.WarningMessage],
            statuses: list[dict[str, Any] | None]) -> FitResult:
    return FitResult(
        callback=auto,
        start_step=start,
        end_step=end,
        event_steps=[e.step for e in auto.events],
        event_reasons=[e.reason for e in auto.events],
        event_epochs=[e.epoch for e in auto.events],
        warnings=list(caught),
        statuses=statuses,
    )


ADAPTERS = {"lightning": LightningFits(), "keras": KerasFits()}
