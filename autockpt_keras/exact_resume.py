"""Exact mid-epoch resume for ``fit()``: where the data stood, and how a new process gets there.

:class:`ExactResume` is the part of :class:`~autockpt_keras.callback.AutoCheckpoint` that
puts a resumed run back at the exact batch and generator state its checkpoint was taken at,
and that says, at each checkpoint, where that is (a
:class:`~autockpt_keras.resume_point.ResumePoint`). The callback creates one per ``fit()``
and calls it from its hooks. It combines the data stream's position
(:mod:`autockpt_keras.data_stream`), the skip of batches already trained
(:mod:`autockpt_keras.skipping`; a ``PyDataset``, a torch ``DataLoader`` and arrays on torch
by index, :mod:`autockpt_keras.index_skip`)
and the global generators (:mod:`autockpt_keras.rng`);
:mod:`autockpt_keras.input_checks` says beforehand what keeps a resume from being exact.

Call order (the callback's hooks, Keras 3's TensorFlow, torch and JAX trainers):

1. ``on_train_begin``: created with ``fit()``'s data iterator (a
   :class:`~autockpt_keras.data_stream.DataStream` starts following it). When a checkpoint
   is restored: :meth:`~ExactResume.prepare_metrics` before its state is assigned,
   :meth:`~ExactResume.resume_from` after (it keeps the checkpoint's resume point and metric
   values, and warns if the interrupted run's inputs were not reproducible).
2. ``on_epoch_begin`` (:meth:`~ExactResume.epoch_begin`): in the resumed epoch: the global
   generators are set to their state when the checkpoint's data iterator was started (so the
   epoch draws the same order), a reshuffling tf.data input is advanced, the metric
   variables are assigned again (``fit()`` reset them), and when the checkpoint is mid-epoch
   a :class:`~autockpt_keras.skipping.SkipSteps` replaces ``model.train_function`` for the
   batches already trained (for a ``PyDataset``, a torch ``DataLoader`` or arrays on torch,
   an :class:`~autockpt_keras.index_skip.IndexSkip` loads one batch for them). Otherwise the generators are captured when a
   new data iterator is about to start.
3. ``on_train_batch_begin`` (:meth:`~ExactResume.batch_begin`): marks the call as skipped or not.
4. ``on_train_batch_end`` (:meth:`~ExactResume.batch_end`, or ``stream.batch_end()`` alone
   while ``skip_through`` is None), before anything else: True for a skipped batch, where the
   callback does nothing else; the last one sets the generators to their state at the
   checkpoint.
5. At a checkpoint: :meth:`~ExactResume.mid_epoch_point`,
   :meth:`~ExactResume.epoch_start_point` or :meth:`~ExactResume.next_epoch_point` capture
   the position and the generators now.
6. ``on_train_end``, or before :class:`~autockpt_core.Preempted` is raised
   (:meth:`~ExactResume.close`): the skip and the stream's hook are removed.

Threading: everything runs on the training thread, inside ``fit()``'s hooks, its creation of
data iterators and its ``train_function`` calls.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping

import numpy as np

from autockpt_core import ResumeNotExactWarning
from autockpt_core.internals_door import PatchStack

from . import rng
from .checkpoint_file import CheckpointInfo
from .data_stream import DataStream, StreamState, advance_dataset
from .index_skip import IndexSkip, SkipPlan, skip_plan
from .input_checks import EXACT_BACKENDS, InputReport
from .resume_point import ResumePoint
from .skipping import SkipSteps, build_metrics
from .state import assign_state, collect_state

log = logging.getLogger("autockpt")


def _print_and_log(message: str) -> None:
    log.info(message)
    print(message, flush=True)


class ExactResume:
    """The exact-resume state of one ``fit()`` call; see the module docstring for the call order.

    ``epoch_iterator``: ``fit()``'s epoch iterator (None if not found); ``inputs``: the
    :class:`~autockpt_keras.input_checks.InputReport` of its data; ``stream``: the
    :class:`~autockpt_keras.data_stream.DataStream` following it.
    """

    def __init__(
        self,
        model: Any,
        backend: str,
        epoch_iterator: Any | None,
        inputs: InputReport,
        patches: PatchStack | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.epoch_iterator = epoch_iterator
        self.inputs = inputs
        self.patches = patches if patches is not None else PatchStack()
        self.stream = DataStream(epoch_iterator, self.capture_rng, backend, self.patches)
        self._resume_point: ResumePoint | None = None  # the checkpoint's, until its epoch begins
        self._metric_arrays: dict[str, Any] | None = None  # the checkpoint's metric values, for that epoch
        self._skipper: SkipSteps | None = None
        # The last batch of the resumed epoch that is skipped, while that skip is ahead. While
        # None, ``stream.batch_end()`` alone is a batch's bookkeeping (the callback's hot path
        # calls it directly: one call less per step than :meth:`batch_end`).
        self.skip_through: int | None = None
        self._rng_after_skip: dict[str, Any] | None = None  # the generators after that batch
        self.skip_plan: SkipPlan = skip_plan(epoch_iterator, inputs.kind, backend)
        self.index_skip: IndexSkip | None = None  # the resumed stream's, while installed
        self._say = False  # print what the skip does (the callback's verbose)

    # -- restoring a checkpoint (on_train_begin) ------------------------------------------------

    def prepare_metrics(self) -> None:
        """Before the checkpoint's state is assigned: on TensorFlow, build the compiled metrics
        so their values can be assigned too."""
        if self.backend == "tensorflow":
            build_metrics(self.model, self.epoch_iterator)

    def resume_from(self, info: CheckpointInfo, arrays: Mapping[str, Any], *, say: bool = False) -> ResumePoint | None:
        """After the checkpoint's state is assigned: keep where its epoch resumes (returned;
        None when the epoch is replayed from its first batch) and its metric values. ``say``:
        print what the skip does where it differs from :attr:`skip_plan`."""
        self._say = say
        point = info.resume
        if point is not None and point.batches_done > 0:
            # copies: the arrays may be views into the whole checkpoint file's bytes
            self._metric_arrays = {k: np.array(arrays[k]) for k in info.keys if k.startswith("metrics/")}
        if self.backend not in EXACT_BACKENDS:
            point = None  # no exact resume on this backend: the epoch is replayed from batch 0
        self._resume_point = point
        if point is not None and point.problems:
            warnings.warn(
                f"autockpt: resuming at step {info.step} is not exact: the interrupted run's inputs "
                "were not reproducible: " + "; ".join(point.problems) + ".",
                ResumeNotExactWarning,
                stacklevel=4,  # the caller of on_train_begin
            )
        return point

    # -- fit() hooks ------------------------------------------------------------------------------

    def epoch_begin(self, epoch: int) -> None:
        """on_epoch_begin: in the resumed epoch, same data order, same generators, skip ahead;
        in any other, note whether the epoch starts a new stream."""
        point, self._resume_point = self._resume_point, None
        if point is None or point.epoch != epoch:
            self.stream.epoch_begin()
            return
        self._restore_rng(point.rng_stream)  # the data iterator of this epoch is created after this hook
        if self.inputs.reshuffles:
            advance_dataset(self.epoch_iterator, point.iterators_before)
        first = point.rng_first_draw
        self._skip_by_index(point.stream_pos)
        self.stream.resume(point, after_creation=(lambda: self._restore_rng(first)) if first is not None else None)
        if point.batches_done > 0:
            if self._metric_arrays:  # fit() reset the metrics before this hook
                assign_state(collect_state(self.model, ("metrics",)), self._metric_arrays, groups=("metrics",))
            self._metric_arrays = None
            self.skip_through = point.batches_done - 1
            self._skipper = SkipSteps(
                self.model, drop=point.drop, epoch_iterator=self.epoch_iterator, patches=self.patches
            )
            self._skipper.install()
            self._rng_after_skip = point.rng_step
        elif point.drop > 0:  # an epoch start in the middle of a stream shared by several epochs
            self._skipper = SkipSteps(
                self.model,
                drop=point.drop,
                epoch_iterator=self.epoch_iterator,
                before_first_step=lambda: self._restore_step_rng(point.rng_step),
                patches=self.patches,
            )
            self._skipper.install()
        else:
            self._restore_rng(point.rng_step)

    def batch_begin(self, batch: int) -> None:
        """on_train_batch_begin: whether this call of ``train_function`` is a skip."""
        if self._skipper is not None:
            self._skipper.skipping = self.skip_through is not None and batch <= self.skip_through

    def batch_end(self, batch: int) -> bool:
        """on_train_batch_end: count the batch; True if it was skipped (nothing else to do)."""
        self.stream.batch_end()  # this batch was drawn, trained or not
        if self.skip_through is not None and batch <= self.skip_through:
            if batch == self.skip_through:  # the interrupted run took its checkpoint here
                self._finish_skip()
            return True
        return False

    def close(self) -> None:
        """End of ``fit()``: put ``train_function`` and the input's dataset back, unwrap the
        epoch iterator."""
        self._end_index_skip()
        if self._skipper is not None:
            self._skipper.uninstall()
            self._skipper = None
        self.skip_through = None
        self.stream.close()

    def release(self) -> None:
        """After ``fit()`` (its final checkpoint taken): drop the references to its epoch
        iterator, so the data iterator Keras made for a next epoch (a ``DataLoader``'s workers,
        a tf.data iterator) ends when Keras drops it, not when this callback does."""
        self.epoch_iterator = None
        self.stream.release()

    # -- resume points (at the moment of the checkpoint) ------------------------------------------

    def mid_epoch_point(self, epoch: int, batch: int) -> ResumePoint:
        """After ``batch`` of ``epoch``: the rerun skips batches 0..batch of it."""
        return self._point(epoch, batch + 1, self.stream.current())

    def epoch_start_point(self, epoch: int) -> ResumePoint:
        """At ``on_epoch_begin(epoch)``, after the stream bookkeeping: the rerun starts ``epoch``."""
        return self._point(epoch, 0, self.stream.current())

    def next_epoch_point(self, epoch: int) -> ResumePoint:
        """After ``epoch`` ran to its end (the final checkpoint): the rerun starts the next one."""
        return self._point(epoch + 1, 0, self.stream.next_epoch())

    def _point(self, epoch: int, batches_done: int, stream: StreamState) -> ResumePoint:
        """The position and the generators now, in ``stream``."""
        return ResumePoint(
            epoch=epoch,
            batches_done=batches_done,
            iterators_before=stream.iterators_before,
            stream_pos=stream.position,
            rng_stream=stream.rng,
            rng_step=self.capture_rng(),
            rng_first_draw=stream.rng_first_draw,
            steps_per_execution=int(getattr(self.model, "steps_per_execution", 1) or 1),
            inputs=self.inputs.kind,
            problems=self.inputs.problems,
        )

    # -- generators -------------------------------------------------------------------------------

    def capture_rng(self) -> dict[str, Any]:
        return rng.capture(self.backend)

    def _finish_skip(self) -> None:
        """The last skipped batch's end: the moment the checkpoint was taken."""
        self.skip_through = None
        self._end_index_skip()
        if self._skipper is not None:
            self._skipper.skipping = False  # the next call trains and puts the original back
        state, self._rng_after_skip = self._rng_after_skip, None
        if state is not None:
            self._restore_step_rng(state)

    def _skip_by_index(self, count: int) -> None:
        """Before the resumed stream's iterator exists: its first ``count`` lookups of a
        ``PyDataset`` or torch ``DataLoader`` load one batch for all of them
        (:mod:`autockpt_keras.index_skip`)."""
        if count <= 0 or not self.skip_plan.by_index or self.epoch_iterator is None:
            return
        say = _print_and_log if self._say else log.info
        self.index_skip = IndexSkip(
            self.epoch_iterator.data_adapter,
            count,
            check_generators=self.inputs.pipeline_thread,
            say=say,
            patches=self.patches,
        )
        self.index_skip.install()

    def _end_index_skip(self) -> None:
        if self.index_skip is not None:
            self.index_skip.uninstall()

    def _restore_step_rng(self, state: dict[str, Any]) -> None:
        """The generators at the checkpoint, once the stream is back where it was then.

        A data pipeline that draws from Python's, numpy's and torch's generators in a
        background thread has drawn ahead by a varying number of batches; its draws are already
        in sequence, so those three are left alone.
        """
        self._restore_rng(state, keep=("python", "numpy", "torch") if self.inputs.pipeline_thread else ())

    def _restore_rng(self, state: dict[str, Any], keep: tuple[str, ...] = ()) -> None:
        problems = rng.restore(state, self.backend, keep=keep)
        if problems:
            warnings.warn(
                "autockpt: resuming is not bitwise exact: " + "; ".join(problems) + ".",
                ResumeNotExactWarning,
                stacklevel=3,
            )
