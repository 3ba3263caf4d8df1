"""Exact resume with AutoCheckpoint, in one process: RNG, loaders, preemption, corrupt files,
storage errors. Every comparison is bitwise, against a run without the callback.

The model and data come from the fault harness's script (dropout, Adam, per-step StepLR,
shuffled training data, a shuffled validation loader): 96 samples, batch 8, 12 steps/epoch.
Subprocess kills are in tests/fault/.
"""

from __future__ import annotations

import errno
import signal
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from autockpt_core import CheckpointWriteError, ResumeNotExactWarning, read_manifest, storage_for
from autockpt_lightning import AutoCheckpoint, latest_checkpoint
from autockpt_lightning.validation_watch import EXACT_AT_EPOCH_END
from tests.fault.harness import assert_weights_equal, corrupt_newest
from tests.fault.lightning_script import Net, train, weights_of
from tests.faults import FailingStorage
from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer

torch.set_num_threads(1)
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]

STEPS_PER_EPOCH = 12

_baselines: dict[tuple[str, bool, int], dict[str, np.ndarray]] = {}


def baseline(tmp_path: Path, loader: str = "stateful", val: bool = True, epochs: int = 2) -> dict[str, np.ndarray]:
    """Weights of the uninterrupted run without the callback (computed once per setting)."""
    key = (loader, val, epochs)
    if key not in _baselines:
        model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader=loader, val=val, epochs=epochs)
        _baselines[key] = weights_of(model)
    return _baselines[key]


def steps_of(dirpath: Path) -> list[int]:
    return [r.step for r in read_manifest(storage_for(dirpath))]


class CrashAt(Net):
    """Raises in training_step once the global step reaches ``CRASH_AT`` (a crash without a signal)."""

    CRASH_AT = 1000

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step >= self.CRASH_AT:
            raise RuntimeError("simulated crash")
        return super().training_step(batch, batch_idx)


def crash_at(step: int) -> type[Net]:
    return type(f"CrashAt{step}", (CrashAt,), {"CRASH_AT": step})


class SignalAt(Net):
    """Sends ``SIGNUM`` to this process inside the training step with global step ``AT``."""

    AT, SIGNUM = 1000, signal.SIGTERM

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == self.AT:
            signal.raise_signal(self.SIGNUM)
        return super().training_step(batch, batch_idx)


def signal_at(step: int, signum: int) -> type[Net]:
    return type(f"SignalAt{step}", (SignalAt,), {"AT": step, "SIGNUM": signum})


# -- the callback itself changes nothing ---------------------------------------------------------


@pytest.mark.parametrize("loader", ["stateful", "sampler"])
def test_callback_without_failures_leaves_training_bitwise_unchanged(tmp_path: Path, loader: str) -> None:
    model, _, cb = train(str(tmp_path / "ck"), loader=loader, val=True, epochs=2, every=1)
    assert cb is not None and len(cb.events) >= 18  # a checkpoint at nearly every step
    assert_weights_equal(weights_of(model), baseline(tmp_path, loader))


# -- resume from a checkpoint ---------------------------------------------------------------------


def resume_and_compare(tmp_path: Path, loader: str, steps: list[int], epochs: int = 2) -> None:
    ckpts = tmp_path / "every"
    _, _, cb = train(str(ckpts), loader=loader, val=True, epochs=epochs, every=1, keep_last=1000)
    assert cb is not None
    saved = {e.step for e in cb.events if e.reason != "end of training"}
    # Deferred: never at the last batch of an epoch (validation follows it) ...
    assert not {STEPS_PER_EPOCH * e for e in range(1, epochs + 1)} & saved
    for step in steps:
        assert step in saved, (step, sorted(saved))
        path = ckpts / f"ckpt-step{step:09d}.ckpt"
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResumeNotExactWarning)
            model, trainer, _ = train(
                str(tmp_path / f"r{step}"), loader=loader, val=True, epochs=epochs, ckpt_path=str(path), every=1000
            )
        assert_weights_equal(weights_of(model), baseline(tmp_path, loader, epochs=epochs))


@pytest.mark.parametrize(
    "loader, steps",
    [
        ("stateful", [1, 7, 13, 20]),  # mid-epoch, the first step after an epoch end + validation
        ("sampler", [5, 13]),
        ("sampler-workers", [6]),  # the iterator is re-created at the restored position
        ("iterable", [3, 13]),  # unsized: the batch Lightning fetched ahead is carried over
    ],
)
def test_resume_from_a_checkpoint_ends_bitwise_equal(tmp_path: Path, loader: str, steps: list[int]) -> None:
    resume_and_compare(tmp_path, loader, steps)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["stateful", "sampler", "iterable"])
def test_resume_from_every_checkpoint_ends_bitwise_equal(tmp_path: Path, loader: str) -> None:
    saved = [s for s in range(1, 3 * STEPS_PER_EPOCH) if s % STEPS_PER_EPOCH]
    resume_and_compare(tmp_path, loader, saved, epochs=3)


def test_auto_resume_after_a_crash_ends_bitwise_equal(tmp_path: Path) -> None:
    ckpts = str(tmp_path / "ck")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(ckpts, val=True, epochs=2, every=3, model_cls=crash_at(17))
    model, _, cb = train(ckpts, val=True, epochs=2, every=3)
    assert cb is not None and cb.resumed_from == 15
    assert_weights_equal(weights_of(model), baseline(tmp_path))


# -- warnings where a resume cannot be exact -----------------------------------------------------


def test_plain_dataloader_is_warned_about_once(tmp_path: Path) -> None:
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, verbose=False)
    trainer = make_trainer(tmp_path, [cb], max_steps=3, enable_checkpointing=False)
    with pytest.warns(ResumeNotExactWarning, match="not resumable.*StatefulDataLoader.*ResumableSampler"):
        trainer.fit(TinyModel(), TinyData())
    trainer.fit_loop.epoch_loop.max_steps = 6
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeNotExactWarning)
        trainer.fit(TinyModel(), TinyData())


@pytest.mark.parametrize("loader", ["stateful", "sampler", "iterable"])
def test_resumable_loaders_get_no_warning_even_on_resume(tmp_path: Path, loader: str) -> None:
    ckpts = str(tmp_path / "ck")
    with pytest.raises(RuntimeError):
        train(ckpts, loader=loader, epochs=1, every=3, model_cls=crash_at(5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(ckpts, loader=loader, epochs=1, every=3)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "autockpt" in m or "resuming from a checkpoint" in m], messages


# -- preemption ------------------------------------------------------------------------------------


def test_sigterm_commits_a_checkpoint_exits_143_and_the_rerun_is_exact(tmp_path: Path) -> None:
    ckpts = str(tmp_path / "ck")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        train(ckpts, val=True, epochs=2, every=4, model_cls=signal_at(6, signal.SIGTERM))
    assert info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) == before  # ours and Lightning's handlers are gone
    newest = read_manifest(storage_for(ckpts))[-1]
    assert newest.step == 7 and newest.meta["reason"] == "preempted by SIGTERM"  # not a multiple of 4
    model, _, cb = train(ckpts, val=True, epochs=2, every=4)
    assert cb is not None and cb.resumed_from == 7
    assert_weights_equal(weights_of(model), baseline(tmp_path))


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_at_the_end_of_an_epoch_is_committed_in_the_validation_after_it(tmp_path: Path, signum: int) -> None:
    """Not at the epoch's last batch (Lightning cannot resume exactly from there): at the first
    batch of the validation that follows, which can."""
    ckpts = str(tmp_path / "ck")
    with pytest.raises(SystemExit) as info:
        # step index 11 ends the first epoch (validation follows): the checkpoint is step 12
        train(ckpts, val=True, epochs=2, every=100, model_cls=signal_at(STEPS_PER_EPOCH - 1, signum))
    assert info.value.code == 128 + signum  # SIGTERM: Lightning's own handler used to exit 0 here
    assert steps_of(Path(ckpts)) == [STEPS_PER_EPOCH]
    resumes_exactly(lambda: train(ckpts, val=True, epochs=2, every=100), tmp_path)


def resumes_exactly(rerun: Any, tmp_path: Path) -> None:
    """The rerun ends bitwise equal to the baseline; before Lightning 2.6, which does not resume
    exactly from the validation after an epoch's last batch, it warns so instead."""
    if not EXACT_AT_EPOCH_END:
        with pytest.warns(ResumeNotExactWarning, match="does not resume from exactly"):
            rerun()
        return
    model, _, _ = rerun()
    assert_weights_equal(weights_of(model), baseline(tmp_path))


def test_on_preempt_continue_checkpoints_and_trains_on(tmp_path: Path) -> None:
    ckpts = str(tmp_path / "ck")
    model, trainer, cb = train(
        ckpts, val=True, epochs=2, every=100, keep_last=5, on_preempt="continue", model_cls=signal_at(4, signal.SIGUSR1)
    )
    assert cb is not None and cb.preempted is not None and (cb.preempted.step, cb.preempted.signal) == (5, "SIGUSR1")
    assert trainer.global_step == 2 * STEPS_PER_EPOCH and steps_of(Path(ckpts)) == [5, 2 * STEPS_PER_EPOCH]
    assert_weights_equal(weights_of(model), baseline(tmp_path))


def test_no_signals_configured_installs_nothing(tmp_path: Path) -> None:
    seen: list[str] = []

    class Probe(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(repr(signal.getsignal(signal.SIGUSR1)))
            return super().training_step(batch, batch_idx)

    train(str(tmp_path / "ck"), epochs=1, every=100, signals=(), model_cls=Probe)
    assert set(seen) == {repr(signal.SIG_DFL)}


# -- crash consistency ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["truncate", "bitflip"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, mode: str) -> None:
    ckpts = tmp_path / "ck"
    with pytest.raises(RuntimeError):
        train(str(ckpts), val=True, epochs=2, every=3, model_cls=crash_at(17))
    assert steps_of(ckpts) == [12 + 1, 15]  # 12 is an epoch end: deferred to 13; keep_last=2
    corrupt_newest(ckpts, mode)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint ckpt-step000000015.ckpt"):
        model, _, cb = train(str(ckpts), val=True, epochs=2, every=3)
    assert cb is not None and cb.resumed_from == 13
    assert_weights_equal(weights_of(model), baseline(tmp_path))


@pytest.mark.parametrize(
    "error, hint",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "disk or quota is full"),
        (PermissionError(errno.EACCES, "Permission denied"), "may not write there"),
    ],
)
def test_storage_error_stops_training_clearly_and_keeps_older_checkpoints(
    tmp_path: Path, error: OSError, hint: str
) -> None:
    ckpts = tmp_path / "ck"

    class FailFromStep9(FailingStorage):
        def write_atomic(self, name: str, write: Any) -> Any:
            self.armed = name.endswith(".ckpt") and int(name[9:18]) >= 9
            return super().write_atomic(name, write)

    storage = FailFromStep9(ckpts, fail_after=3000, error=error)
    with pytest.raises(CheckpointWriteError) as info:
        train(str(ckpts), val=True, epochs=2, every=3, storage=storage)
    assert hint in str(info.value) and "ckpt-step000000009.ckpt" in str(info.value)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "autockpt-manifest.json",
        "autockpt-status.json",
        "ckpt-step000000003.ckpt",
        "ckpt-step000000006.ckpt",
    ]  # no temporary or partial file; nothing older deleted
    assert latest_checkpoint(ckpts) == str(ckpts / "ckpt-step000000006.ckpt")
    model, _, cb = train(str(ckpts), val=True, epochs=2, every=3)  # the disk is fine again
    assert cb is not None and cb.resumed_from == 6
    assert_weights_equal(weights_of(model), baseline(tmp_path))


@pytest.mark.parametrize("auto_requeue", [True, False])
def test_lightning_slurm_auto_requeue_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auto_requeue: bool
) -> None:
    from lightning.fabric.plugins.environments import SLURMEnvironment

    for name, value in dict(SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, verbose=False)
    plugins = [SLURMEnvironment(auto_requeue=auto_requeue)]
    trainer = make_trainer(tmp_path, [cb], max_steps=2, plugins=plugins, enable_checkpointing=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyModel(), TinyData(stateful=True))
    slurm = [str(w.message) for w in caught if "SLURM auto-requeue" in str(w.message)]
    assert len(slurm) == (1 if auto_requeue else 0)
    if auto_requeue:
        assert "SLURMEnvironment(auto_requeue=False)" in slurm[0]


# -- the end of training ---------------------------------------------------------------------------


def test_final_checkpoint_holds_the_trained_model_and_a_rerun_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpts = str(tmp_path / "ck")
    model, trainer, cb = train(ckpts, val=True, epochs=2, every=5)
    assert cb is not None and cb.events[-1].reason == "end of training"
    assert steps_of(Path(ckpts))[-1] == 2 * STEPS_PER_EPOCH  # not 20: the trained model itself
    final = torch.load(latest_checkpoint(ckpts), weights_only=False)
    for name, value in model.state_dict().items():
        assert torch.equal(final["state_dict"][name], value), name

    capsys.readouterr()
    _, again, cb2 = train(ckpts, val=True, epochs=2, every=5)
    assert cb2 is not None and cb2.resumed_from == 2 * STEPS_PER_EPOCH and cb2.events == []
    assert again.global_step == 2 * STEPS_PER_EPOCH
    assert "nothing left to train: the checkpoint of step 24 already reached the end" in capsys.readouterr().out
    assert steps_of(Path(ckpts))[-1] == 2 * STEPS_PER_EPOCH


def test_more_epochs_after_the_final_checkpoint_continue_bitwise_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lightning does not continue exactly from an epoch's end: the checkpoint before the final one is used."""
    ckpts = str(tmp_path / "ck")
    train(ckpts, val=True, epochs=2, every=5)
    final = read_manifest(storage_for(ckpts))[-1]
    # trained in epoch 1 (0-based), after which the fit had completed 2 epochs
    assert (final.step, final.epoch, final.meta["epochs_done"], final.meta["continues_exactly"]) == (24, 1, 2, False)
    capsys.readouterr()
    model, trainer, cb = train(ckpts, val=True, epochs=3, every=5)
    assert cb is not None and cb.resumed_from == 20
    assert "training beyond the final checkpoint of step 24: continuing from step 20" in capsys.readouterr().out
    assert_weights_equal(weights_of(model), baseline(tmp_path, epochs=3))


def test_more_epochs_with_only_the_final_checkpoint_left_warn(tmp_path: Path) -> None:
    ckpts = str(tmp_path / "ck")
    train(ckpts, val=True, epochs=2, every=100)
    with pytest.warns(ResumeNotExactWarning, match="final checkpoint of step 24"):
        _, trainer, cb = train(ckpts, val=True, epochs=3, every=100)
    assert cb is not None and cb.resumed_from == 24 and trainer.global_step == 3 * STEPS_PER_EPOCH


def test_signal_during_validation_commits_the_last_step_at_once_and_exits_143(tmp_path: Path) -> None:
    """SIGTERM in the first validation batch after the epoch's last step: the next validation
    batch commits that step (not the step after validation), and the resume, which runs the
    interrupted validation again, ends bitwise equal."""
    ckpts = str(tmp_path / "ck")
    seen: list[int] = []

    class SignalInValidation(Net):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen.append(batch_idx)
            if self.trainer.global_step == STEPS_PER_EPOCH and batch_idx == 0:
                signal.raise_signal(signal.SIGTERM)
            super().validation_step(batch, batch_idx)

    with pytest.raises(SystemExit) as info:
        train(ckpts, val=True, epochs=2, every=5, model_cls=SignalInValidation)
    assert info.value.code == 143  # never 0 (Lightning's own SIGTERMException exits 0)
    assert seen == [0]  # acted on before the second validation batch
    newest = read_manifest(storage_for(ckpts))[-1]
    assert newest.step == STEPS_PER_EPOCH and newest.meta["reason"] == "preempted by SIGTERM"
    assert ("not_exact" in newest.meta) is not EXACT_AT_EPOCH_END
    resumed: list[Any] = []
    resumes_exactly(lambda: resumed.append(train(ckpts, val=True, epochs=2, every=5)) or resumed[-1], tmp_path)
    assert resumed[-1][2] is not None and resumed[-1][2].resumed_from == STEPS_PER_EPOCH


def test_third_signal_ends_the_process_by_the_default_action(tmp_path: Path) -> None:
    """A stuck emergency checkpoint cannot hold a job: a repeat at once is the same request
    delivered twice (srun + torchrun), the third SIGTERM terminates it."""
    import subprocess
    import sys

    code = (
        "import signal, time\n"
        "from autockpt_core import PreemptionHandler\n"
        "h = PreemptionHandler(('SIGTERM',)); h.install()\n"
        "signal.raise_signal(signal.SIGTERM)\n"
        "assert h.requested\n"
        "print('first recorded', flush=True)\n"
        "signal.raise_signal(signal.SIGTERM)\n"
        "assert h.installed and h.absorbed == 1\n"
        "print('repeat absorbed', flush=True)\n"
        "signal.raise_signal(signal.SIGTERM)\n"
        "time.sleep(5)\n"
        "print('still alive', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM and "first recorded" in done.stdout
    assert "repeat absorbed" in done.stdout and "still alive" not in done.stdout


def test_sigint_when_configured_is_a_preemption_not_a_keyboard_interrupt(tmp_path: Path) -> None:
    ckpts = str(tmp_path / "ck")
    saved = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as info:
            train(ckpts, val=True, epochs=2, every=100, signals=("SIGINT",), model_cls=signal_at(4, signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, saved)
    assert info.value.code == 130  # 128 + SIGINT, after the checkpoint; no KeyboardInterrupt mid-step
    newest = read_manifest(storage_for(ckpts))[-1]
    assert newest.step == 5 and newest.meta["reason"] == "preempted by SIGINT"


def test_a_shuffling_loader_that_ddp_wraps_is_named_and_a_distributed_sampler_is_not() -> None:
    """What Lightning's data connector does to train loaders under DDP (``_update_dataloader``
    with a ``DistributedSamplerWrapper`` around the loader's own sampler, for rank 0 of 2): the
    wrapped random sampler draws each epoch's order when the iterator is created, so the check
    names it; torchdata's StatefulDistributedSampler is kept as it is and passes."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.utilities.data import _update_dataloader
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    from autockpt_lightning.resume import random_sampler_wrapped_for_ranks

    data = torch.utils.data.TensorDataset(torch.arange(32.0))
    shuffled = StatefulDataLoader(data, batch_size=4, shuffle=True)  # torchdata's RandomSampler: wrapped
    wrapper = DistributedSamplerWrapper(shuffled.sampler, num_replicas=2, rank=0, shuffle=True)
    sharded = _update_dataloader(shuffled, wrapper)
    assert random_sampler_wrapped_for_ranks(sharded) == "torchdata.stateful_dataloader.sampler.RandomSampler"
    ordered = StatefulDataLoader(data, batch_size=4, shuffle=False)
    wrapper = DistributedSamplerWrapper(ordered.sampler, num_replicas=2, rank=0, shuffle=False)
    assert random_sampler_wrapped_for_ranks(_update_dataloader(ordered, wrapper)) is None
    seeded = StatefulDataLoader(data, batch_size=4, sampler=StatefulDistributedSampler(data, num_replicas=2, rank=0))
    assert random_sampler_wrapped_for_ranks(seeded) is None
