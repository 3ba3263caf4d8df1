"""Leaving autockpt's format: a Lightning checkpoint as a plain ``.ckpt``, or as the model's tensors.

An autockpt Lightning checkpoint is already Lightning's own (:mod:`.checkpoint_file`:
``torch.save`` of ``dump_checkpoint``). The one entry in it that only autockpt reads is the
callback's under ``callbacks`` (:data:`CALLBACK_KEY`: each rank's generator states, the
samplers' positions, the batches a loader fetched ahead, for an exact resume). A
``Trainer.fit(ckpt_path=...)`` without ``AutoCheckpoint`` warns about that entry ("Please add
the following callbacks: ['AutoCheckpoint']"), so :func:`plain_checkpoint` leaves it out;
everything else stays as written (weights, optimizer and scheduler states, loops, epoch and
step, hyperparameters, other callbacks' entries, datamodule and precision state).

``autockpt export`` (:mod:`autockpt_bench.export`) picks and verifies the checkpoint and hands
its bytes here: :func:`read_checkpoint` (weights only unless ``allow_pickle``), then
:func:`save_checkpoint` of :func:`plain_checkpoint`, or :func:`save_tensors` of
:func:`model_tensors`. Nothing here runs during ``fit()``.
"""

from __future__ import annotations

import io
import os
from typing import Any, Mapping

import torch
from lightning.pytorch.utilities.migration import pl_legacy_patch

from .callback import AutoCheckpoint

CALLBACK_KEY = AutoCheckpoint.__qualname__
"""The callback's key in a checkpoint's ``callbacks`` (Lightning's ``Callback.state_key``)."""


def read_checkpoint(data: Any, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The checkpoint dict in ``data`` (a file's bytes), tensors on the CPU.

    Weights only (as a resume loads it) unless ``allow_pickle``: an object of another class (an
    ``argparse.Namespace`` in ``save_hyperparameters()``) then raises ``pickle.UnpicklingError``
    (:func:`refused_names` names them).
    """
    with pl_legacy_patch():
        checkpoint = torch.load(io.BytesIO(memoryview(data)), map_location="cpu", weights_only=not allow_pickle)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"not a Lightning checkpoint (a {type(checkpoint).__name__} without 'state_dict')")
    return checkpoint


def refused_names(data: Any) -> list[str]:
    """The classes and functions in ``data`` a weights-only load refuses (``module.name``)."""
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    try:
        return sorted(find(io.BytesIO(memoryview(data)))) if find is not None else []
    except Exception:  # noqa: BLE001 - the names only improve a message
        return []


def plain_checkpoint(checkpoint: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``checkpoint`` without autockpt's own entry, and what was left out (see the module docstring)."""
    plain = dict(checkpoint)
    callbacks = plain.get("callbacks")
    if not isinstance(callbacks, dict) or CALLBACK_KEY not in callbacks:
        return plain, []
    plain["callbacks"] = {key: state for key, state in callbacks.items() if key != CALLBACK_KEY}
    return plain, [f"callbacks[{CALLBACK_KEY!r}]"]


def save_checkpoint(checkpoint: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``checkpoint`` as a ``.ckpt`` file (``torch.save``, as Lightning's checkpoint IO)."""
    torch.save(dict(checkpoint), path)


def model_tensors(checkpoint: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The ``state_dict``'s tensors, each contiguous and with storage of its own (a safetensors
    file refuses tensors that share memory, such as tied weights: the second is copied), and
    the keys of the entries that are no tensors (an ``_extra_state`` object), left out."""
    tensors: dict[str, torch.Tensor] = {}
    skipped: list[str] = []
    storages: set[int] = set()
    for key, value in checkpoint["state_dict"].items():
        if not isinstance(value, torch.Tensor):
            skipped.append(key)
            continue
        tensor = value.detach().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in storages and tensor.numel():
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
    return tensors, skipped


def save_tensors(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str], metadata: Mapping[str, str]
) -> None:
    """Write ``tensors`` as a safetensors file (``safetensors.torch.save_file``) with string ``metadata``."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ValueError("writing a .safetensors file needs the safetensors package: pip install safetensors") from None
    save_file(dict(tensors), os.fspath(path), metadata={str(k): str(v) for k, v in metadata.items()})
