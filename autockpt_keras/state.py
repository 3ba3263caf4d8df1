"""Which Keras variables make up the training state, under which keys, and how to assign them.

The state is every variable ``model.get_state_tree()`` covers, in three groups:

- ``model``: ``model.variables`` (trainable and non-trainable weights, e.g. BatchNorm moving
  statistics, and the ``SeedGenerator`` states of dropout and other random layers);
- ``optimizer``: ``model.optimizer.variables`` (``iterations``, learning rate, slots);
- ``metrics``: ``model.metrics_variables`` (loss tracker and compiled metrics).

Keys are ``"<group>/<variable.path>"``, e.g. ``"model/sequential/dense/kernel"``. Grouping the
model's weights under one prefix (instead of trainable/non-trainable) keeps keys stable when a
layer is frozen or unfrozen. A path seen twice (possible with hand-named layers) gets ``#2``,
``#3`` ... in collection order, which is deterministic for a model built the same way.

Under a one-process ``tf.distribute`` strategy (``MirroredStrategy``), each device holds its
own copy of every variable. Trainable and optimizer variables stay equal across devices, but
the copies of non-trainable variables do not: BatchNorm's moving statistics are updated from
each device's share of the batch (Keras 3 keeps them per device), and a metric's total is a
per-device partial sum. Reading the variable gives the first device's copy (the sum, for a
metric), which is what a plain checkpoint holds; so for a non-trainable distributed variable
each device's copy is stored too, under ``"<key>@replica<i>"`` (a :class:`ReplicaCopy`
entry in the same group), and assigned back to that device. A run resumed on another number
of devices skips those keys (the copies then start from the first device's values).

Nothing here runs in a background thread: collection and assignment happen on the training
thread, between steps.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from autockpt_core import AutockptError

GROUPS = ("model", "optimizer", "metrics")
REPLICA = "@replica"  # "<key>@replica<i>": device i's copy of a distributed variable


class StateMismatchError(AutockptError, ValueError):
    """A checkpoint does not fit the model it is restored into (other architecture)."""


@dataclasses.dataclass(frozen=True)
class StateEntry:
    """One variable of the training state and the key it is stored under."""

    key: str
    group: str
    variable: Any  # a keras.Variable

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.variable.shape)


def unique_keys(names: Iterable[str]) -> list[str]:
    """``names`` with repeats made unique by a ``#2``, ``#3`` ... suffix, first one unchanged."""
    seen: dict[str, int] = {}
    taken = set()
    out = []
    for name in names:
        count = seen.get(name, 0) + 1
        seen[name] = count
        key = name if count == 1 else f"{name}#{count}"
        while key in taken:  # a literal "x#2" path collides with the renamed second "x"
            count += 1
            seen[name] = count
            key = f"{name}#{count}"
        taken.add(key)
        out.append(key)
    return out


class ReplicaCopy:
    """One device's copy of a distributed TensorFlow variable, read and assigned like a Keras
    variable (``value``, ``shape``, ``dtype``, ``numpy()``, ``assign()``)."""

    def __init__(self, component: Any) -> None:
        self.value = component  # a tf.Variable on one device

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.value.shape)

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    def numpy(self) -> Any:
        return self.value.numpy()

    def assign(self, value: Any) -> None:
        self.value.assign(value)


def replica_copies(variable: Any) -> list[ReplicaCopy]:
    """Each device's copy of a non-trainable distributed variable (empty for any other)."""
    if getattr(variable, "trainable", True):
        return []
    components = getattr(getattr(variable, "value", None), "values", None)  # tf.distribute values
    if not isinstance(components, tuple) or len(components) < 2:
        return []
    return [ReplicaCopy(c) for c in components]


def collect_state(model: Any, include: Sequence[str] = GROUPS) -> list[StateEntry]:
    """The model's training state as keyed entries, in a deterministic order.

    A variable reachable from two groups is listed once, in the first group. Each device's copy
    of a non-trainable distributed variable follows it (see the module docstring).
    """
    seen_ids: set[int] = set()
    pairs: list[tuple[str, Any]] = []
    for group in include:
        for variable in _group_variables(model, group):
            if id(variable) in seen_ids:
                continue
            seen_ids.add(id(variable))
            pairs.append((group, variable))
    keys = unique_keys(f"{group}/{variable.path}" for group, variable in pairs)
    entries = []
    for key, (group, variable) in zip(keys, pairs):
        entries.append(StateEntry(key, group, variable))
        entries.extend(StateEntry(f"{key}{REPLICA}{i}", group, copy) for i, copy in enumerate(replica_copies(variable)))
    return entries


def _group_variables(model: Any, group: str) -> list[Any]:
    if group == "model":
        return list(model.variables)
    if group == "optimizer":
        optimizer = getattr(model, "optimizer", None)
        return list(optimizer.variables) if optimizer is not None else []
    if group == "metrics":
        return list(model.metrics_variables)
    raise ValueError(f"unknown state group {group!r}; expected one of {GROUPS}")


def ensure_built(model: Any) -> None:
    """Make sure every variable a checkpoint holds exists before values are assigned.

    On the torch backend ``fit()`` builds model, optimizer and metrics before
    ``on_train_begin``; on the TensorFlow backend (without a distribution strategy) it defers
    building to the first trace of the train step. The optimizer is built here from the
    trainable variables, exactly as Keras' own symbolic build does. An unbuilt model cannot
    be built without an input shape, so that raises with the fix. Compiled metrics that are
    still unbuilt are left alone: ``fit()`` resets metrics at the start of every epoch.
    """
    if not model.built or not model.variables:
        raise StateMismatchError(
            f"cannot restore into model {model.name!r}: it has no variables yet (not built). "
            "Fix: build it before fit(), e.g. start it with keras.Input(shape=...), call it on a "
            "batch, or call model.build(input_shape) (a subclassed model needs a build() method "
            "that creates its layers' variables for that)."
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)


@dataclasses.dataclass(frozen=True)
class AssignReport:
    """What ``assign_state`` did: keys assigned, metric keys skipped, groups matched by position."""

    assigned: int
    skipped: tuple[str, ...] = ()
    matched_by_position: tuple[str, ...] = ()


def assign_state(
    entries: Sequence[StateEntry],
    arrays: Mapping[str, np.ndarray],
    order: Sequence[str] | None = None,
    groups: Sequence[str] = GROUPS,
) -> AssignReport:
    """Assign checkpoint ``arrays`` to the variables in ``entries``.

    Per group, variables are matched by key. When the keys differ (the same architecture built
    a second time in one process gets other layer names, e.g. ``dense_1``) but the group has
    the same number of variables with the same shapes in the same order, they are matched by
    position, with a warning. Anything else in the ``model`` or ``optimizer`` group raises
    :class:`StateMismatchError` before any variable is changed. Metric variables are assigned
    where they match and skipped otherwise. ``order`` is the checkpoint's key order (from its
    metadata); by default the order of ``arrays``. Checkpoint entries of groups not in
    ``groups`` are skipped (e.g. ``("model",)`` loads weights only).

    All values are checked first, then assigned, so a mismatch leaves the model untouched.
    """
    ckpt_keys = list(order) if order is not None else list(arrays)
    plan: list[tuple[StateEntry, np.ndarray]] = []
    skipped: list[str] = []
    by_position: list[str] = []
    # per-device copies: assigned after their variable where key and shape match, else skipped
    copies = [e for e in entries if REPLICA in e.key]
    entries = [e for e in entries if REPLICA not in e.key]
    copy_keys = [k for k in ckpt_keys if REPLICA in k]
    ckpt_keys = [k for k in ckpt_keys if REPLICA not in k]
    for group in GROUPS:
        mine = [e for e in entries if e.group == group]
        theirs = [k for k in ckpt_keys if k.split("/", 1)[0] == group]
        if group not in groups:
            skipped.extend(theirs)
            continue
        if group == "metrics":  # reset by fit() at every epoch start: best effort, by key
            matched = {e.key for e in mine if e.key in arrays and _shape(arrays[e.key]) == e.shape}
            plan.extend((e, arrays[e.key]) for e in mine if e.key in matched)
            skipped.extend(k for k in theirs if k not in matched)
            continue
        if {e.key for e in mine} == set(theirs):
            pairs = [(e, arrays[e.key]) for e in mine]
        elif len(mine) == len(theirs) and all(
            e.shape == _shape(arrays[k]) for e, k in zip(mine, theirs)
        ):
            pairs = [(e, arrays[k]) for e, k in zip(mine, theirs)]
            by_position.append(group)
        else:
            raise StateMismatchError(_mismatch_message(group, mine, theirs))
        for entry, value in pairs:
            if entry.shape != _shape(value):
                raise StateMismatchError(
                    f"checkpoint value for {entry.key} has shape {_shape(value)}, the model's "
                    f"variable has shape {entry.shape}. Fix: restore into the model the "
                    "checkpoint was written from, or start from an empty dirpath."
                )
        plan.extend(pairs)
    matched_copies = {
        e.key for e in copies if e.group in groups and e.key in arrays and _shape(arrays[e.key]) == e.shape
    }
    plan.extend((e, arrays[e.key]) for e in copies if e.key in matched_copies)
    skipped.extend(k for k in copy_keys if k not in matched_copies)
    if by_position:
        warnings.warn(
            f"autockpt: variable names differ from the checkpoint's in group(s) {', '.join(by_position)}; "
            "matched them by position (same count, same shapes). This happens when a model is "
            "built twice in one process.",
            RuntimeWarning,
            stacklevel=3,
        )
    for entry, value in plan:
        entry.variable.assign(value)
    return AssignReport(len(plan), tuple(skipped), tuple(by_position))


def _shape(array: np.ndarray) -> tuple[int, ...]:
    return tuple(int(d) for d in array.shape)


def _mismatch_message(group: str, mine: Sequence[StateEntry], theirs: Sequence[str]) -> str:
    mine_keys = [e.key for e in mine]
    missing = [k for k in mine_keys if k not in set(theirs)][:5]
    unexpected = [k for k in theirs if k not in set(mine_keys)][:5]
    return (
        f"the checkpoint's {group} state does not fit this model: the model has "
        f"{len(mine)} {group} variables, the checkpoint {len(theirs)}; not in the checkpoint: "
        f"{missing}; only in the checkpoint: {unexpected}. Fix: restore into the architecture "
        "the checkpoint was written from (and the same optimizer), or use another dirpath."
    )
