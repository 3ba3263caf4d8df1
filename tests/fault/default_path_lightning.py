"""A Lightning job as users write it, run by test_default_path.py under ``ulimit -Sn 1024``.

    python tests/fault/default_path_lightning.py DIRPATH MIN_PROCESS_WRITES OUT.json

``AutoCheckpoint(DIRPATH)`` with default settings (the persist process, the budget policy);
a model of 300 layers (600 parameters, 1,800 optimizer tensors); hyper-parameters in a
dataclass and an enum defined here, in ``__main__``, saved with ``save_hyperparameters``.
It trains until the persist process has written MIN_PROCESS_WRITES checkpoints (at most
MAX_STEPS steps), so the process is up and in use. A rerun of the same command resumes from
the final checkpoint (weights only, with the two classes allowed) and checks the
hyper-parameters it finds there. Writes OUT.json.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import resource
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from autockpt_core import read_manifest, storage_for  # noqa: E402
from tests.fault.child import report  # noqa: E402
from autockpt_lightning import AutoCheckpoint  # noqa: E402

torch.set_num_threads(1)
MAX_STEPS = 4000


class Activation(enum.Enum):
    TANH = "tanh"


@dataclasses.dataclass
class HParams:
    layers: int = 300
    width: int = 4
    activation: Activation = Activation.TANH
    lr: float = 1e-3


class DeepNet(pl.LightningModule):
    def __init__(self, hp: HParams) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(*[nn.Linear(hp.width, hp.width) for _ in range(hp.layers)])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(torch.tanh(self.net(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.hp.lr)


class Observe(pl.Callback):
    """Stops once the persist process wrote enough; records descriptors in use at each step."""

    def __init__(self, auto: AutoCheckpoint, min_process_writes: int) -> None:
        self.auto, self.min_writes = auto, min_process_writes
        self.start_step: int | None = None
        self.peak_fds = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.peak_fds = max(self.peak_fds, len(os.listdir("/proc/self/fd")))
        session = self.auto.session
        if session is not None and session.process_writes >= self.min_writes:
            trainer.should_stop = True


def main(dirpath: str, min_process_writes: int) -> dict[str, Any]:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A resume loads weights only; the script's own classes in the hyper-parameters are allowed
    # by name, as autockpt's refusal says (docs/reliability.md, "Trust").
    torch.serialization.add_safe_globals([HParams, Activation])
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 4, generator=gen), torch.rand(512, 4, generator=gen)
    auto = AutoCheckpoint(dirpath)
    observe = Observe(auto, min_process_writes)
    trainer = pl.Trainer(
        max_steps=MAX_STEPS, callbacks=[auto, observe], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    model = DeepNet(HParams())
    tensors = len(model.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8))
    session = auto.session
    assert session is not None
    newest = read_manifest(storage_for(dirpath))[-1]
    saved = torch.load(Path(dirpath) / newest.name, weights_only=False)  # HParams exists here
    return {
        "soft_limit": soft,
        "tensors": tensors + sum(len(s) for s in trainer.optimizers[0].state.values()),
        "start_step": observe.start_step,
        "final_step": trainer.global_step,
        "events": [e.step for e in auto.events],
        "persist_mode": session.persist_mode.mode,
        "process_writes": session.process_writes,
        "peak_fds": observe.peak_fds,
        "records": [r.step for r in read_manifest(storage_for(dirpath))],
        "batches_per_epoch": trainer.num_training_batches,
        "saved_hp_ok": saved["hyper_parameters"]["hp"] == HParams(),
        "autockpt_warnings": [str(w.message) for w in caught if "persist process" in str(w.message)],
    }


if __name__ == "__main__":
    report(lambda: main(sys.argv[1], int(sys.argv[2])), sys.argv[3])
