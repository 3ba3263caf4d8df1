"""At the first checkpoint of a fit: would a resume's weights-only load take it?

A resume loads weights only unless ``allow_pickle=True`` (``docs/reliability.md``, "Trust"):
an object of a class torch does not allow (an ``argparse.Namespace`` or a ``pathlib.Path`` in
``save_hyperparameters()``, a callback's custom state) makes that load refuse the checkpoint.
Found at the first resume, that is days late. So the first checkpoint's tree is checked when
it is taken: its tensors replaced by empty ones, the rest saved into memory (a few kB) and
read back by ``torch.serialization.get_unsafe_globals_in_checkpoint``, which also honours
``add_safe_globals``. A refused class is warned about at once, with the fixes.

Call order (training thread, rank 0): :meth:`FirstCheckpointCheck.check` with each
checkpoint's tree; it works once per fit. On a torch without that function (before 2.5) a
weights-only load of the skeleton stands in for it.
"""

from __future__ import annotations

import io
import logging
import pickle
import warnings
from typing import Any

import torch

from autockpt_core.persist.tree import map_tree

log = logging.getLogger("autockpt")


class UnloadableCheckpointWarning(UserWarning):
    """A checkpoint holds objects a weights-only resume will refuse (see the module docstring)."""


def refused_by_weights_only(tree: Any) -> list[str]:
    """The classes and functions in ``tree`` a weights-only load refuses (``module.name``)."""
    skeleton = map_tree(
        tree, lambda x: isinstance(x, torch.Tensor), lambda _path, t: torch.empty(0, dtype=t.dtype), lambda x: x
    )
    buffer = io.BytesIO()
    torch.save(skeleton, buffer)
    buffer.seek(0)
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if find is not None:
        return sorted(find(buffer))
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as exc:
        return [str(exc).splitlines()[-1]]
    return []


class FirstCheckpointCheck:
    """Warns at the first checkpoint whose tree a weights-only load would refuse; nothing
    with ``allow_pickle`` (that load is then not weights-only)."""

    def __init__(self, allow_pickle: bool) -> None:
        self._done = allow_pickle

    def check(self, tree: Any, step: int) -> None:
        if self._done:
            return
        self._done = True
        try:
            names = refused_by_weights_only(tree)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run must not cost the checkpoint
            log.debug("autockpt: could not check the checkpoint for a weights-only load: %s", exc)
            return
        if not names:
            return
        classes = ", ".join(name.rpartition(".")[2] for name in names)
        message = (
            f"autockpt: the checkpoint of step {step} holds {', '.join(names)}, which a resume's weights-only "
            "load refuses: a rerun would stop with UntrustedCheckpointError. Fix: keep plain types (dict, "
            "list, str, numbers) in save_hyperparameters() and the state you checkpoint; or, if these classes "
            f"are yours, torch.serialization.add_safe_globals([{classes}]) before fit(); or allow_pickle=True "
            "if you trust everyone who can write dirpath and the mirror"
        )
        log.warning(message)
        warnings.warn(message, UnloadableCheckpointWarning, stacklevel=2)
