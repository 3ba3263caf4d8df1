"""Lightning worker of the framework study (``autockpt compare``, ``autockpt goodput``).

``python -m autockpt_bench.workers.lightning_study {train,restore,goodput} --spec SPEC.json``
runs one case of :mod:`autockpt_bench.study.protocol` (read it for the spec and result keys)
on the CPU: the workload's model from :mod:`.lightning_models` with Adam, a torchdata
``StatefulDataLoader`` over ``make_data`` (no shuffle), ``Trainer(max_steps=steps)``.

Methods: ``none``; ``autockpt`` (``AutoCheckpoint(every_n_steps=every)``); ``autockpt-budget``
(``overhead_budget``); ``autockpt-ab`` (``every_n_steps=every`` in the alternating blocks of
:mod:`autockpt_bench.study.in_process_ab`); ``modelcheckpoint`` (``ModelCheckpoint(every_n_train_steps=every)``);
``async`` (the same + ``AsyncCheckpointIO``); goodput adds ``every-epoch`` (ModelCheckpoint's
default per-epoch save + ``save_last``, resumed with ``ckpt_path="last"``), ``native-every-n``
and ``autockpt-mtbf``.

How it is measured (``time.perf_counter`` unless said otherwise):

- step ends: in the LightningModule's ``on_train_batch_end``, which Lightning calls after every
  callback's, so a step's time includes its checkpoint.
- blocked time: the time spent in the method's callback hooks (``on_train_batch_end``; for
  autockpt also ``on_before_optimizer_step``, where an overlapping copy is waited for; for the
  per-epoch ModelCheckpoint ``on_train_epoch_end``), per step; a checkpoint after step ``s``
  is blocked for the excess over the quiet steps' median hook time in steps ``s`` and ``s + 1``
  (:meth:`.study_common.Timeline.figures`; in ``goodput`` a running median of quiet steps).
- which checkpoints: autockpt's ``session.save`` calls; ModelCheckpoint's
  ``trainer.save_checkpoint`` calls (deduplicated per step).
- save time: from the start of that call to the end of the write (autockpt: the writer's
  commit, seen through ``session.profiler.record_persist``; ModelCheckpoint: the end of the
  base ``CheckpointIO.save_checkpoint``, in AsyncCheckpointIO's thread for ``async``).
- load time (``restore``): time inside Lightning's ``_restore_modules_and_callbacks``
  (reading the file, loading the module and callbacks) and ``restore_training_state``
  (optimizer, loops, data loader); for autockpt the whole ``AutoCheckpoint.on_fit_start``
  (finding and verifying the newest checkpoint, then the same Lightning restore), in place of
  the first.
"""

from __future__ import annotations

import time

_STARTED = time.time()  # goodput's "start" event: before torch and Lightning are imported

import os
import re
import statistics
import sys
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from ..study import protocol
from ..study.in_process_ab import Alternation
from ..study.workloads import Workload
from .hooks import wrap_call
from .study_common import (
    Timeline,
    ab_result,
    finish_restore,
    finish_train,
    path_bytes,
    reported_overhead,
    serve,
    setup_threads,
    time_hooks,
)

AUTOCKPT = ("autockpt", "autockpt-budget", "autockpt-mtbf")
NEVER = 10**9  # every_n_steps of a restoring run: it loads, never writes


class Probe:
    """What the training thread did, fed by the LightningModule's hooks and the wrapped save calls."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.timeline = Timeline()
        self.trainer: Any = None
        self.resumed_step: int | None = None
        self.first_step_t: float | None = None  # time.time() at the end of the first trained step
        self.writes: list[tuple[int, float]] = []  # (step, perf_counter at its start) per file written
        self.write_end: list[float] = []  # perf_counter at the end of each write, in the same order
        self.checkpoint_t: dict[int, float] = {}  # time.time() at the start of each checkpoint, by step
        self.on_start: Callable[[int], None] | None = None  # goodput: logs "resumed"
        self.on_step: Callable[[int], None] | None = None  # goodput: logs "step" and checkpoints
        self.at_last_step: Callable[[], None] | None = None  # train: finishes the process
        self.alternation: Alternation | None = None  # train, autockpt-ab: the in-process A/B

    def step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def saving(self, step: int) -> None:
        """A write of the checkpoint after ``step`` starts (training thread)."""
        self.writes.append((step, time.perf_counter()))
        if step not in self.checkpoint_t:  # ModelCheckpoint with save_last writes twice per checkpoint
            self.checkpoint_t[step] = time.time()
            self.timeline.checkpoint(step)

    def written(self, *_: Any, **__: Any) -> None:
        """A write ended (any thread; writes end in the order they started)."""
        self.write_end.append(time.perf_counter())

    def save_times(self) -> None:
        """Each checkpoint's save_s: start of its first write to end of its last (once all are complete)."""
        start: dict[int, float] = {}
        end: dict[int, float | None] = {}
        for i, (step, t0) in enumerate(self.writes):
            start.setdefault(step, t0)
            end[step] = self.write_end[i] if i < len(self.write_end) else None
        for step in self.timeline.checkpoint_steps:
            t1 = end.get(step)
            self.timeline.checkpoint(step, t1 - start[step] if t1 is not None else None)

    # -- hooks (from StudyModule) ---------------------------------------------------------------

    def train_start(self, trainer: Any) -> None:
        self.trainer = trainer
        self.resumed_step = trainer.global_step
        if self.on_start is not None:
            self.on_start(trainer.global_step)

    def batch_end(self, trainer: Any) -> None:
        step = trainer.global_step
        if self.first_step_t is None:
            self.first_step_t = time.time()
        self.timeline.step_done(step)
        if self.alternation is not None:
            self.alternation.step_done(step)
        if self.on_step is not None:
            self.on_step(step)
        if step >= self.steps and self.at_last_step is not None:
            self.at_last_step()

    # -- instrumenting the methods -------------------------------------------------------------

    def watch_autockpt(self, callback: Any) -> None:
        """Time the callback's hooks; see its saves and their commits (once the session exists)."""
        time_hooks(callback, ("on_train_batch_end", "on_before_optimizer_step"), self.timeline, self.step)

        def on_fit_start(*_: Any) -> None:
            session = callback.session
            wrap_call(session, "save", before=lambda step, *a, **k: self.saving(step))
            wrap_call(session.profiler, "record_persist", after=self.written)  # the writer thread, after the commit
            if self.alternation is not None:
                self.alternation.attach(session)

        wrap_call(callback, "on_fit_start", after=lambda seconds, args, out: on_fit_start(*args))

    def watch_modelcheckpoint(self, callback: Any, hooks: tuple[str, ...] = ("on_train_batch_end",)) -> None:
        """Time the callback's hooks; see ``trainer.save_checkpoint`` and the base CheckpointIO's writes."""
        time_hooks(callback, hooks, self.timeline, self.step)

        def on_fit_start(trainer: Any, *_: Any) -> None:
            from lightning.pytorch.plugins.io import AsyncCheckpointIO

            wrap_call(trainer, "save_checkpoint", before=lambda *a, **k: self.saving(trainer.global_step))
            io = trainer.strategy.checkpoint_io
            base = io.checkpoint_io if isinstance(io, AsyncCheckpointIO) else io
            wrap_call(base, "save_checkpoint", after=self.written)

        wrap_call(callback, "on_fit_start", after=lambda seconds, args, out: on_fit_start(*args))


def _trainer(spec: dict[str, Any], steps: int, callbacks: list[Any], plugins: list[Any] | None = None) -> Any:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*callbacks used to create the checkpoint need to be provided.*")
    return pl.Trainer(
        max_steps=steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=spec["dir"],
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        callbacks=callbacks, plugins=plugins or [],
    )


def _autockpt(spec: dict[str, Any], method: dict[str, Any], resume: bool, every: int | None = None) -> Any:
    from autockpt_lightning import AutoCheckpoint

    if method.get("user_defaults"):  # examples/process_fixed_costs.py: what a user gets with no argument
        return AutoCheckpoint(spec["dir"])
    keywords: dict[str, Any] = {}
    if every is not None:
        keywords["every_n_steps"] = every
    elif method["name"] in ("autockpt", "autockpt-ab"):
        keywords["every_n_steps"] = int(method["every"])
    else:
        keywords["overhead_budget"] = method["budget"]
        if method["name"] == "autockpt-mtbf":
            keywords["mtbf"] = method["mtbf_s"]
    if not spec.get("notice_s"):  # goodput --notice: the default signals, so the notice is acted on
        keywords["signals"] = ()
    return AutoCheckpoint(spec["dir"], keep_last=2, resume=resume, verbose=False, save_on_train_end=False, **keywords)


def newest_ckpt(directory: str) -> str | None:
    """The ``.ckpt`` file in ``directory`` with the highest ``step=N`` (newest mtime to break ties)."""
    def key(name: str) -> tuple[int, float]:
        m = re.search(r"step=(\d+)", name)
        return (int(m.group(1)) if m else -1, os.path.getmtime(os.path.join(directory, name)))

    names = [n for n in os.listdir(directory) if n.endswith(".ckpt")] if os.path.isdir(directory) else []
    return os.path.join(directory, max(names, key=key)) if names else None


# -- cases ------------------------------------------------------------------------------------------


def train(workload: Workload, method: dict[str, Any], spec: dict[str, Any]) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from . import lightning_models as models

    name, steps = method["name"], int(spec["steps"])
    os.makedirs(spec["dir"], exist_ok=True)
    probe = Probe(steps)
    callbacks: list[Any] = []
    plugins: list[Any] = []
    callback: Any = None
    if name in ("autockpt", "autockpt-budget", "autockpt-ab"):
        callback = _autockpt(spec, method, resume=False)
        if name == "autockpt-ab":
            probe.alternation = Alternation(int(method["block"]), int(spec["warmup"]))
        probe.watch_autockpt(callback)
    elif name in ("modelcheckpoint", "async"):
        callback = ModelCheckpoint(dirpath=spec["dir"], every_n_train_steps=int(method["every"]), save_top_k=-1,
                                   save_last=False)
        probe.watch_modelcheckpoint(callback)
        if name == "async":
            plugins.append(AsyncCheckpointIO())
    elif name != "none":
        raise SystemExit(f"lightning_study: unknown train method {name!r}")
    if callback is not None:
        callbacks.append(callback)
    model = models.StudyModule(workload, probe)
    trainer = _trainer(spec, steps, callbacks, plugins)

    def finish() -> None:  # at the end of step `steps`, before any end-of-training hook
        checkpoint: str | None = None
        if name.startswith("autockpt"):
            session = callback.session
            session.flush()  # the last persist is committed
            records = session.records()
            checkpoint = session.path_of(max(records, key=lambda r: r.step)) if records else None
        elif name in ("modelcheckpoint", "async"):
            io = trainer.strategy.checkpoint_io
            if isinstance(io, AsyncCheckpointIO):
                io.teardown()  # waits for the executor's writes
            checkpoint = newest_ckpt(spec["dir"])
        probe.save_times()
        result = {
            "framework": "lightning", "workload": workload.name, "method": name,
            "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "state_bytes": models.state_bytes(model, trainer.optimizers[0]),
            "steps": steps, "warmup": int(spec["warmup"]),
            **probe.timeline.figures(int(spec["warmup"])),
            "checkpoint_bytes": path_bytes(checkpoint) if checkpoint else None,
            "format": ".ckpt", "threads": int(spec.get("threads", 0)),
            **(reported_overhead(callback.session) if name.startswith("autockpt") else {}),
        }
        if probe.alternation is not None:
            result.update(ab_result(probe.timeline, probe.alternation))
        finish_train(spec, result, models.trainable_weights(model))

    probe.at_last_step = finish
    trainer.fit(model, models.loader(workload))
    raise SystemExit(f"lightning_study: training ended at step {trainer.global_step} before step {steps}")


class LoadTimer:
    """Seconds inside the wrapped calls; calls nested in a timed call count once."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    def wrap(self, obj: Any, name: str) -> None:
        wrap_call(obj, name, before=self._enter, after=self._leave)

    def _enter(self, *_: Any, **__: Any) -> None:
        self._depth += 1

    def _leave(self, seconds: float, *_: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += seconds


def restore(workload: Workload, method: dict[str, Any], spec: dict[str, Any]) -> None:
    from . import lightning_models as models

    if method["name"].startswith("autockpt"):
        import autockpt_lightning  # noqa: F401 - what autockpt adds to a restart's imports
    imports_s = time.time() - float(spec["started_at"])
    name, steps = method["name"], int(spec["steps"])
    probe = Probe(steps)
    load = LoadTimer()
    callbacks: list[Any] = []
    ckpt_path: str | None = None
    if name.startswith("autockpt"):
        callback = _autockpt(spec, method, resume=True, every=NEVER)
        load.wrap(callback, "on_fit_start")
        callbacks.append(callback)
    elif name in ("modelcheckpoint", "async"):
        ckpt_path = newest_ckpt(spec["dir"])
        if ckpt_path is None:
            raise SystemExit(f"lightning_study: no .ckpt file in {spec['dir']}")
    else:
        raise SystemExit(f"lightning_study: method {name!r} has no restore")
    model = models.StudyModule(workload, probe)
    trainer = _trainer(spec, steps, callbacks)
    load.wrap(trainer._checkpoint_connector, "_restore_modules_and_callbacks")
    load.wrap(trainer._checkpoint_connector, "restore_training_state")
    trainer.fit(model, models.loader(workload), ckpt_path=ckpt_path)
    first = probe.first_step_t if probe.first_step_t is not None else time.time()  # nothing left to train
    result = {
        "framework": "lightning", "workload": workload.name, "method": name,
        "restore_s": first - float(spec["started_at"]), "imports_s": imports_s, "load_s": load.seconds,
        # the StatefulDataLoader puts its sampler back by index: no batch is drawn to skip
        "skip_s": None,
        "resumed_step": probe.resumed_step if probe.resumed_step is not None else trainer.global_step,
        "final_step": trainer.global_step,
    }
    finish_restore(spec, result, models.trainable_weights(model))


def goodput(workload: Workload, method: dict[str, Any], spec: dict[str, Any], log: protocol.EventLog) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from . import lightning_models as models

    name, steps = method["name"], int(spec["steps"])
    os.makedirs(spec["dir"], exist_ok=True)
    probe = Probe(steps)
    callbacks: list[Any] = []
    ckpt_path: str | None = None
    callback: Any = None
    if name in AUTOCKPT:
        callback = _autockpt(spec, method, resume=True)
        probe.watch_autockpt(callback)
    elif name in ("every-epoch", "native-every-n"):
        if name == "every-epoch":
            callback = ModelCheckpoint(dirpath=spec["dir"], save_last=True)
        else:
            callback = ModelCheckpoint(dirpath=spec["dir"], every_n_train_steps=int(method["every"]), save_last=True)
        probe.watch_modelcheckpoint(callback, ("on_train_batch_end", "on_train_epoch_end"))
        if os.path.exists(os.path.join(spec["dir"], "last.ckpt")):
            ckpt_path = "last"
    elif name != "none":
        raise SystemExit(f"lightning_study: unknown goodput method {name!r}")
    if callback is not None:
        callbacks.append(callback)

    timeline = probe.timeline
    quiet: deque[float] = deque(maxlen=101)  # hook times of recent steps without a checkpoint
    logged: set[int] = set()

    def excess(step: int) -> float:
        base = statistics.median(quiet) if quiet else 0.0
        return max(0.0, timeline.hook_s.get(step, 0.0) - base)

    def log_checkpoints(before: int | None) -> None:
        """Log the checkpoints after steps < ``before`` (None: all); blocked = excess hook time of s and s + 1."""
        taken = set(timeline.checkpoint_steps)
        for s in timeline.checkpoint_steps:
            if s in logged or (before is not None and s >= before):
                continue
            parts = [s] + ([s + 1] if s + 1 not in taken and s + 1 in timeline.step_end else [])
            log.write("checkpoint", step=s, t=probe.checkpoint_t[s], blocked_s=sum(excess(p) for p in parts))
            logged.add(s)

    def on_step(step: int) -> None:
        log.write("step", step=step)
        taken = set(timeline.checkpoint_steps)
        prev = step - 1  # complete now: its epoch-end hooks have run
        if prev in timeline.step_end and prev not in taken and prev - 1 not in taken:
            quiet.append(timeline.hook_s.get(prev, 0.0))
        log_checkpoints(before=step)

    probe.on_start = lambda step: log.write("resumed", step=step)
    probe.on_step = on_step
    model = models.StudyModule(workload, probe)
    trainer = _trainer(spec, steps, callbacks)
    try:
        trainer.fit(model, models.loader(workload), ckpt_path=ckpt_path)
    except SystemExit:  # goodput --notice: autockpt's emergency checkpoint, then Preempted (exit 143)
        log_checkpoints(None)
        raise
    if trainer.global_step < steps:
        raise SystemExit(f"lightning_study: training ended at step {trainer.global_step} before step {steps}")
    if probe.resumed_step is None:  # the checkpoint already held the last step: nothing was trained
        log.write("resumed", step=trainer.global_step)
    log_checkpoints(None)
    persist_s = callback.session.estimates().persist_s if name in AUTOCKPT and callback.session is not None else None
    log.write("done", step=trainer.global_step, persist_s=persist_s)


def run_case(case: str, workload: Workload, method: dict[str, Any], spec: dict[str, Any],
             log: protocol.EventLog | None) -> None:  # fmt: skip
    threads = int(spec.get("threads", 0))
    setup_threads(threads)
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    if case == "train":
        train(workload, method, spec)
    elif case == "restore":
        restore(workload, method, spec)
    else:
        assert log is not None
        goodput(workload, method, spec, log)


def main(argv: list[str] | None = None) -> int:
    return serve(argv, "python -m autockpt_bench.workers.lightning_study", _STARTED, run_case)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
