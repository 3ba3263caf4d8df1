"""AutoCheckpoint (autockpt_lightning/callback.py): construction, and real training on the CPU."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import warnings
import zipfile
from pathlib import Path
from typing import IO, Any, Callable

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

import autockpt_lightning
from autockpt_core import (
    AutockptError,
    CheckpointWriteError,
    Config,
    ConfigError,
    LocalStorage,
    WriteResult,
    read_manifest,
)
from autockpt_core.callback_settings import CONFIG_DEFAULTS
from autockpt_core.persist.storage import storage_for
from autockpt_lightning import AutoCheckpoint, latest_checkpoint
from tests.faults import FailingStorage
from tests.lightning.lightning_helpers import Recorder, TinyData, TinyModel, make_trainer

torch.set_num_threads(1)


def load(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def step_file(dirpath: Path, step: int) -> Path:
    return dirpath / f"ckpt-step{step:09d}.ckpt"


def assert_state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


class ListLogger(Logger):
    """Keeps every log_metrics call."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


class HookedStorage(LocalStorage):
    """Local storage that runs ``before(name)`` ahead of each checkpoint write."""

    def __init__(self, root: Path, before: Callable[[str], None]) -> None:
        super().__init__(root)
        self.before = before

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name.endswith(".ckpt"):
            self.before(name)
        return super().write_atomic(name, write)


# -- construction ----------------------------------------------------------------------------


def test_public_api() -> None:
    assert autockpt_lightning.__all__ == ["AutoCheckpoint", "ResumableSampler", "latest_checkpoint"]


def test_constructor_mirrors_every_config_field() -> None:
    params = inspect.signature(AutoCheckpoint).parameters
    for field in dataclasses.fields(Config):
        assert field.name in params, f"AutoCheckpoint has no keyword for Config.{field.name}"
        if field.default is not dataclasses.MISSING:
            assert params[field.name].default == field.default, field.name


def test_keywords_build_a_validated_config(tmp_path: Path) -> None:
    cb = AutoCheckpoint(tmp_path, overhead_budget="3%", mtbf="6h", keep_last=2)
    assert cb.config.dirpath == str(tmp_path)
    assert cb.config.overhead_budget == pytest.approx(0.03)
    assert cb.config.mtbf == 6 * 3600
    assert cb.config.keep_last == 2


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"overhead_budget": 2}, "overhead_budget"),
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"schedule": "sometimes"}, "schedule"),
        ({"mtbf": "soon"}, "mtbf"),
    ],
)
def test_bad_value_raises_config_error_at_construction(tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        AutoCheckpoint(tmp_path, **kwargs)
    assert info.value.field == field


def test_dirpath_is_required() -> None:
    with pytest.raises(ConfigError, match="dirpath"):
        AutoCheckpoint()


def test_config_object_and_file(tmp_path: Path) -> None:
    base = Config(dirpath=str(tmp_path / "a"), every_n_steps=7)
    assert AutoCheckpoint(config=base).config == base
    overridden = AutoCheckpoint(tmp_path / "b", keep_last=5, config=base).config
    assert (overridden.dirpath, overridden.keep_last, overridden.every_n_steps) == (str(tmp_path / "b"), 5, 7)
    # A keyword written by the user wins even when it equals its default (keep_last=3).
    five = Config(dirpath=str(tmp_path / "a"), keep_last=5)
    assert AutoCheckpoint(config=five, keep_last=CONFIG_DEFAULTS["keep_last"]).config.keep_last == 3
    assert AutoCheckpoint(config=five).config.keep_last == 5

    yaml_file = tmp_path / "autockpt.yaml"
    yaml_file.write_text(f"autockpt:\n  dirpath: {tmp_path / 'c'}\n  overhead_budget: 1%\n")
    cb = AutoCheckpoint.from_config(yaml_file, keep_last=4)
    assert (cb.config.overhead_budget, cb.config.keep_last) == (pytest.approx(0.01), 4)
    toml_file = tmp_path / "autockpt.toml"
    toml_file.write_text(f"[autockpt]\ndirpath = '{tmp_path / 'd'}'\nevery_n_steps = 3\n")
    assert AutoCheckpoint.from_config(toml_file).config.every_n_steps == 3


def test_loss_is_taken_from_training_step_outputs_and_read_only_when_asked() -> None:
    from autockpt_lightning.step_loss import loss_of as _loss_of

    loss = torch.tensor(0.5, requires_grad=True) * 1.0
    taken = _loss_of({"loss": loss, "extra": 1})
    assert isinstance(taken, torch.Tensor) and not taken.requires_grad  # kept as a tensor, detached
    assert float(taken) == 0.5 and float(_loss_of(torch.tensor([2.0]))) == 2.0
    assert _loss_of(None) is None and _loss_of({"other": 1.0}) is None
    assert _loss_of(torch.ones(3)) is None
    assert _loss_of(3) == 3.0


# -- training ------------------------------------------------------------------------------


@pytest.mark.integration
def test_rerun_resumes_weights_optimizer_and_step_with_default_model_checkpoint(tmp_path: Path) -> None:
    ckpts = tmp_path / "autockpt"
    # No final checkpoint: the newest is step 20, older than ModelCheckpoint's step-25 file.
    first = AutoCheckpoint(ckpts, every_n_steps=10, save_on_train_end=False)
    trainer = make_trainer(tmp_path, [first], max_steps=25)  # default ModelCheckpoint stays enabled
    trainer.fit(TinyModel(), TinyData())
    assert [e.step for e in first.events] == [10, 20]
    assert latest_checkpoint(ckpts) == str(step_file(ckpts, 20))
    assert list((tmp_path / "checkpoints").glob("*.ckpt")), "the default ModelCheckpoint wrote nothing"

    # Rerun the same construction with more steps and no ckpt_path.
    second = AutoCheckpoint(ckpts, every_n_steps=10)
    recorder = Recorder(second)
    trainer = make_trainer(tmp_path, [second, recorder], max_steps=40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyModel(), TinyData())
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "ckpt_path" in m or "last checkpoint" in m], messages

    saved = load(step_file(ckpts, 20))
    assert second.resumed_from == 20 and recorder.start_step == 20 and saved["global_step"] == 20
    assert trainer.ckpt_path == str(step_file(ckpts, 20))  # ours, not ModelCheckpoint's newer step-25 file
    assert_state_equal(recorder.start_weights, saved["state_dict"])
    saved_exp_avg = [s["exp_avg"] for _, s in sorted(saved["optimizer_states"][0]["state"].items())]
    assert len(recorder.start_exp_avg) == len(saved_exp_avg) == 4
    for live, stored in zip(recorder.start_exp_avg, saved_exp_avg):
        assert torch.equal(live, stored)
    assert [e.step for e in second.events] == [30, 40]
    assert trainer.global_step == 40

    # Opting out starts from scratch.
    fresh = AutoCheckpoint(ckpts, every_n_steps=10, resume=False)
    recorder = Recorder(fresh)
    make_trainer(tmp_path, [fresh, recorder], max_steps=3).fit(TinyModel(), TinyData())
    assert recorder.start_step == 0 and fresh.resumed_from is None


@pytest.mark.integration
def test_crash_and_rerun_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    class CrashAt25(TinyModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 25:
                raise RuntimeError("simulated crash")
            return super().training_step(batch, batch_idx)

    def model(cls: type[TinyModel] = TinyModel) -> TinyModel:
        torch.manual_seed(0)
        return cls()

    data = dict(samples=256, stateful=True)  # 32 batches per epoch: resume lands mid-epoch
    reference = model()
    make_trainer(tmp_path / "a", [], max_steps=40, enable_checkpointing=False).fit(reference, TinyData(**data))

    ckpts = tmp_path / "b"
    with pytest.raises(RuntimeError, match="simulated crash"):
        cb = AutoCheckpoint(ckpts, every_n_steps=10, verbose=False)
        make_trainer(ckpts, [cb], max_steps=40, enable_checkpointing=False).fit(model(CrashAt25), TinyData(**data))
    resumed = model()
    cb = AutoCheckpoint(ckpts, every_n_steps=10, verbose=False)
    make_trainer(ckpts, [cb], max_steps=40, enable_checkpointing=False).fit(resumed, TinyData(**data))
    assert cb.resumed_from == 20
    assert_state_equal(resumed.state_dict(), reference.state_dict())


@pytest.mark.integration
def test_second_fit_on_the_same_trainer_continues_in_memory(tmp_path: Path) -> None:
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, verbose=False)
    recorder = Recorder(cb)
    trainer = make_trainer(tmp_path, [cb, recorder], max_steps=12, enable_checkpointing=False)
    model, data = TinyModel(), TinyData()
    trainer.fit(model, data)
    trainer.fit_loop.epoch_loop.max_steps = 16
    trainer.fit(model, data)
    assert recorder.start_step == 12 and cb.resumed_from is None  # not rolled back to step 10
    assert [e.step for e in cb.events] == [15, 16]  # 16: the final checkpoint
    assert cb.events[-1].reason == "end of training"


@pytest.mark.integration
def test_ckpt_files_load_in_lightning_and_user_ckpt_path_wins(tmp_path: Path) -> None:
    ckpts = tmp_path / "autockpt"
    first = AutoCheckpoint(ckpts, every_n_steps=5, keep_last=5)
    make_trainer(tmp_path, [first], max_steps=15, enable_checkpointing=False).fit(TinyModel(hidden=12), TinyData())
    saved = load(step_file(ckpts, 10))

    restored = TinyModel.load_from_checkpoint(step_file(ckpts, 10))
    assert restored.hparams.hidden == 12
    with zipfile.ZipFile(step_file(ckpts, 10)) as archive:  # a valid zip: every record's CRC-32 matches
        assert archive.testzip() is None
    assert_state_equal(restored.state_dict(), saved["state_dict"])

    # A user-given ckpt_path wins over auto-resume (which would pick step 15).
    cb = AutoCheckpoint(ckpts, every_n_steps=5, keep_last=5)
    recorder = Recorder(cb)
    trainer = make_trainer(tmp_path, [cb, recorder], max_steps=17, enable_checkpointing=False)
    trainer.fit(TinyModel(hidden=12), TinyData(), ckpt_path=str(step_file(ckpts, 10)))
    assert recorder.start_step == 10 and cb.resumed_from is None
    assert_state_equal(recorder.start_weights, saved["state_dict"])
    assert [e.step for e in cb.events] == [15, 17]  # 17: the final checkpoint


@pytest.mark.integration
def test_every_n_steps_spacing_and_logged_metrics(tmp_path: Path) -> None:
    logger = ListLogger()
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=4, keep_last=10)
    trainer = make_trainer(tmp_path, [cb], max_steps=18, logger=logger, enable_checkpointing=False)
    trainer.fit(TinyModel(), TinyData())
    assert [e.step for e in cb.events] == [4, 8, 12, 16, 18]  # 18: the final checkpoint
    assert [r.step for r in read_manifest(storage_for(tmp_path / "ck"))] == [4, 8, 12, 16, 18]
    for step in (4, 8, 12, 16):
        assert load(step_file(tmp_path / "ck", step))["global_step"] == step
    logged = {step: row for step, row in logger.rows if "autockpt/checkpoints" in row}
    assert {4, 8, 12, 16} <= set(logged)
    assert logged[8]["autockpt/interval_steps"] == 4 and logged[8]["autockpt/checkpoints"] == 2
    assert logged[8]["autockpt/stall_ms"] > 0
    # the measured overhead comes with its band, once clean steps and checkpoint work were both
    # seen (on a busy machine every step may overlap a persist: then neither is logged)
    for row in logged.values():
        assert ("autockpt/overhead_pct" in row) == ("autockpt/overhead_band_pct" in row)
        assert row.get("autockpt/overhead_band_pct", 0.0) >= 0


@pytest.mark.integration
def test_gradient_accumulation_decides_on_global_step(tmp_path: Path) -> None:
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=4)
    trainer = make_trainer(tmp_path, [cb], max_steps=8, accumulate_grad_batches=3, enable_checkpointing=False)
    trainer.fit(TinyModel(), TinyData())
    assert [e.step for e in cb.events] == [4, 8]
    saved = load(step_file(tmp_path / "ck", 8))
    assert saved["global_step"] == 8
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"] == 23  # 24th batch ends


@pytest.mark.integration
def test_the_hooks_own_time_is_measured_beside_the_overhead_without_any_checkpoint(tmp_path: Path) -> None:
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=10**6, save_on_train_end=False, warmup_steps=2)
    make_trainer(tmp_path, [cb], max_steps=40, enable_checkpointing=False).fit(TinyModel(), TinyData(samples=1024))
    assert cb.events == []
    session = cb.session
    assert session is not None
    hook_s = session.estimates().hook_s
    assert hook_s is not None and hook_s > 0
    overhead = session.measured_overhead()
    assert overhead.hooks is not None and overhead.hooks > 0  # every step paid the hooks
    assert overhead.value is None  # and no checkpoint cost anything
    assert session.metrics()["autockpt/hook_pct"] == pytest.approx(overhead.hooks * 100)


@pytest.mark.integration
def test_budget_driven_checkpoints_are_spaced_as_the_policy_reported(tmp_path: Path) -> None:
    logger = ListLogger()
    # No fsync: a slow disk would stretch the persist bound and leave too few checkpoints.
    storage = LocalStorage(tmp_path / "ck", fsync=False)
    cb = AutoCheckpoint(tmp_path / "ck", overhead_budget=0.5, keep_last=100, storage=storage)
    recorder = Recorder(cb)
    trainer = make_trainer(tmp_path, [cb, recorder], max_steps=400, logger=logger, enable_checkpointing=False)
    trainer.fit(TinyModel(), TinyData(samples=4096))

    assert cb.events[-1].step == 400
    # The final checkpoint is its own event unless the policy's checkpoint fell on step 400.
    policy_events = cb.events[:-1] if cb.events[-1].reason == "end of training" else cb.events
    steps = [e.step for e in policy_events]
    reasons = {e.step: e.reason for e in cb.events}
    assert cb.events[0].reason.startswith("profiling")
    assert len(steps) >= 3, [(e.step, e.reason) for e in cb.events]
    logged = {step: row for step, row in logger.rows}
    for prev, cur in zip(steps, steps[1:]):
        # A checkpoint due at an epoch's last batch (which Lightning cannot resume exactly) is
        # taken one step later by the callback, with the reason saying so.
        due = cur - 1 if f"deferred from step {cur - 1}" in reasons[cur] else cur
        decision = recorder.decisions[due]
        assert decision.save and decision.interval is not None
        assert due - prev >= decision.interval.steps  # due at this step ...
        for q in range(prev + 1, due):  # ... and not due (or deferred while persisting) before
            before = recorder.decisions[q]
            assert not before.save
            if before.interval is not None and q - prev >= before.interval.steps:
                # deferred while the previous persist runs, paused to re-measure clean steps, or
                # skipped because the final checkpoint comes before this one would be durable
                assert ("deferred" in before.reason or "re-profiling" in before.reason
                        or "skipped: the final checkpoint" in before.reason), (q, before)
        assert logged[cur]["autockpt/interval_steps"] == decision.interval.steps
    event = policy_events[-1]
    assert event.interval_steps == recorder.decisions[event.step].interval.steps
    assert cb.session is not None and cb.session.summary().checkpoints == len(cb.events)


@pytest.mark.integration
def test_persisted_file_is_independent_of_later_training(tmp_path: Path) -> None:
    release = threading.Event()
    # The persist of step 5 is held until step 9 ended: training mutates the live weights
    # and Adam state while the snapshot waits to be serialized.
    storage = HookedStorage(tmp_path / "ck", before=lambda name: release.wait(timeout=30))
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, storage=storage)

    class Release(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 9:
                release.set()

    recorder = Recorder(cb, capture_steps=(5, 9))
    trainer = make_trainer(tmp_path, [cb, recorder, Release()], max_steps=10, enable_checkpointing=False)
    trainer.fit(TinyModel(), TinyData())
    saved = load(step_file(tmp_path / "ck", 5))
    assert_state_equal(saved["state_dict"], recorder.captured[5])
    assert not torch.equal(recorder.captured[9]["net.0.weight"], recorder.captured[5]["net.0.weight"])


class FailOnSecondCheckpoint(FailingStorage):
    """Writes the first checkpoint, then fails mid-file (ENOSPC) on every later one."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.checkpoint_writes = 0

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name.endswith(".ckpt"):
            self.checkpoint_writes += 1
            self.armed = self.checkpoint_writes >= 2
        return super().write_atomic(name, write)


@pytest.mark.integration
def test_persist_failure_raises_in_training_thread_and_keeps_previous_checkpoint(tmp_path: Path) -> None:
    storage = FailOnSecondCheckpoint(tmp_path / "ck")
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, storage=storage)
    trainer = make_trainer(tmp_path, [cb], max_steps=40, enable_checkpointing=False)
    with pytest.raises(CheckpointWriteError, match="ckpt-step000000010") as info:
        trainer.fit(TinyModel(), TinyData())
    assert isinstance(info.value.__cause__, OSError) and storage.failures == 1
    assert trainer.global_step < 40
    assert latest_checkpoint(tmp_path / "ck") == str(step_file(tmp_path / "ck", 5))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "autockpt-manifest.json",
        "autockpt-status.json",
        "ckpt-step000000005.ckpt",
    ]  # the partial file was removed


@pytest.mark.integration
def test_exception_in_training_waits_for_persist_and_propagates(tmp_path: Path) -> None:
    release = threading.Event()
    storage = HookedStorage(tmp_path / "ck", before=lambda name: release.wait(timeout=30))

    class Boom(TinyModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == 7:
                release.set()  # let the persist of step 5 go while the exception unwinds
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=5, storage=storage)
    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(tmp_path, [cb], max_steps=20, enable_checkpointing=False).fit(Boom(), TinyData())
    assert latest_checkpoint(tmp_path / "ck") == str(step_file(tmp_path / "ck", 5))


@pytest.mark.integration
def test_lightning_cli_yaml_class_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures]")
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(sys, "argv", ["train.py"])

    def write_config(init_args: str) -> Path:
        path = tmp_path / "config.yaml"
        path.write_text(
            "trainer:\n"
            "  max_steps: 7\n  accelerator: cpu\n  logger: false\n  enable_progress_bar: false\n"
            "  enable_model_summary: false\n  enable_checkpointing: false\n"
            f"  default_root_dir: {tmp_path}\n"
            "  callbacks:\n"
            "    - class_path: autockpt_lightning.AutoCheckpoint\n"
            f"      init_args:\n{init_args}"
        )
        return path

    good = write_config(f"        dirpath: {tmp_path / 'ck'}\n        every_n_steps: 3\n        mtbf: 6h\n")
    cli = LightningCLI(TinyModel, TinyData, args=["fit", "--config", str(good)], save_config_callback=None)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, AutoCheckpoint)]
    assert cb.config.every_n_steps == 3 and cb.config.mtbf == 6 * 3600
    assert [e.step for e in cb.events] == [3, 6, 7]  # 7: the final checkpoint
    assert latest_checkpoint(tmp_path / "ck") == str(step_file(tmp_path / "ck", 7))

    bad = write_config(f"        dirpath: {tmp_path / 'ck'}\n        overhead_budget: 2\n")
    with pytest.raises(ValueError, match="overhead_budget=2"):
        LightningCLI(TinyModel, TinyData, args=["fit", "--config", str(bad)], save_config_callback=None)


@pytest.mark.integration
def test_latest_checkpoint_skips_a_corrupt_newest_file(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    cb = AutoCheckpoint(tmp_path / "ck", every_n_steps=2, verbose=False)
    make_trainer(tmp_path, [cb], max_steps=4, enable_checkpointing=False).fit(TinyModel(), TinyData())
    newest = step_file(tmp_path / "ck", 4)
    assert latest_checkpoint(tmp_path / "ck") == str(newest)
    newest.write_bytes(newest.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match="skipping checkpoint"):
        assert latest_checkpoint(tmp_path / "ck") == str(step_file(tmp_path / "ck", 2))


@pytest.mark.integration
def test_resuming_into_a_changed_model_names_the_checkpoint_and_the_fix(tmp_path: Path) -> None:
    ckpts = tmp_path / "ck"
    make_trainer(tmp_path, [AutoCheckpoint(ckpts, every_n_steps=5)], max_steps=5).fit(TinyModel(hidden=16), TinyData())
    trainer = make_trainer(tmp_path, [AutoCheckpoint(ckpts, every_n_steps=5)], max_steps=10)
    with pytest.raises(AutockptError) as info:
        trainer.fit(TinyModel(hidden=12), TinyData())
    message = str(info.value)
    assert "ckpt-step000000005.ckpt" in message and "does not fit this model" in message
    assert "size mismatch" in message and "resume=False or another dirpath" in message
