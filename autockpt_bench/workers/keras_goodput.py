"""The ``goodput`` case of the Keras study worker: one history of a job that is killed and rerun.

``step`` in the events is the job's data position (epoch × steps_per_epoch +
batch + 1): for autockpt it is the global step; for ``BackupAndRestore`` (which replays the
epoch) it goes back to the epoch's start after a resume, while ``optimizer.iterations`` keeps
counting (the ``resumed`` event has it as ``global_step``). ``blocked_s`` is the time in the
method's save function (autockpt ``_take``: snapshot plus any wait for the previous persist).

Called by :func:`.keras_study.run_case` in the worker process (training thread); events go to
the case's :class:`~autockpt_bench.study.protocol.EventLog`; the job's end is ``os._exit(0)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..study.protocol import EventLog
from .hooks import wrap_call
from .keras_job import Job
from .keras_methods import make_autockpt, make_probe

GOODPUT_METHODS = ("none", "every-epoch", "native-every-n", "autockpt", "autockpt-budget", "autockpt-mtbf")


def run_goodput(job: Job, log: EventLog) -> None:
    import keras

    from .keras_models import build_model

    name, d, spe, method = job.name, job.dir, job.spe, job.method
    model = build_model(job.workload)
    callbacks: list[Any] = []
    auto: Any = None
    probe: Any = None

    def checkpoint_event(step: Callable[[tuple[Any, ...]], int]) -> Callable[[float, tuple[Any, ...], Any], None]:
        return lambda seconds, args, out: log.write("checkpoint", step=step(args), blocked_s=seconds)

    if name in ("every-epoch", "native-every-n"):
        save_freq = "epoch" if name == "every-epoch" else int(method["every"])
        cb = keras.callbacks.BackupAndRestore(str(d), save_freq=save_freq)
        wrap_call(cb, "_save_model", after=checkpoint_event(lambda args: probe.position()))
        callbacks.append(cb)
    elif name in ("autockpt", "autockpt-budget", "autockpt-mtbf"):
        auto = make_autockpt({**method, "name": "autockpt" if name == "autockpt" else "autockpt-budget"}, d, resume=True,
                             signals=bool(job.spec.get("notice_s")))  # goodput --notice: act on the SIGTERM
        wrap_call(auto, "_take", after=checkpoint_event(lambda args: args[0].step))
        callbacks.append(auto)
    elif name != "none":
        raise ValueError(f"unknown goodput method {name!r}; use one of {', '.join(GOODPUT_METHODS)}")

    def on_begin(step: int) -> None:
        if auto is not None:
            position = auto.restored.step if auto.restored is not None else 0
        else:
            position = (model._initial_epoch or 0) * spe  # BackupAndRestore sets it (the epoch to replay)
        log.write("resumed", step=position, global_step=step)

    finish_fit = bool(job.spec.get("finish_fit"))  # examples/process_fixed_costs.py: fit() ends as a user's does

    def on_step(step: int, position: int) -> None:
        log.write("step", step=position)
        if position >= job.steps and not finish_fit:
            persist_s = auto.session.estimates().persist_s if auto is not None else None
            log.write("done", step=position, persist_s=persist_s)
            os._exit(0)

    probe = make_probe(model, spe, on_step, on_begin)
    job.fit(model, callbacks + [probe])
    if not finish_fit:
        raise RuntimeError(f"fit() ended before the job's step {job.steps}")
    log.write("done", step=job.steps, persist_s=None)  # after the end-of-training hooks
