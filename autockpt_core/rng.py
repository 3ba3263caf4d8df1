"""Capture and restore the framework-neutral random number generators: Python and numpy.

Exact resume needs the global generators as they were when the checkpoint was taken. This
module covers the two every framework shares:

- Python's ``random`` module (``random.getstate``);
- numpy's legacy global generator (``np.random.get_state``; the one ``np.random.rand``,
  ``np.random.permutation`` and ``np.random.shuffle`` draw from).

Generators the user creates (``np.random.default_rng(seed)``, ``random.Random(seed)``) are
objects of their own and are not global: they must be saved by whoever owns them. Framework
generators live in the adapters (``autockpt_torch.rng`` adds torch CPU and CUDA).

The captured state is plain JSON (dicts, lists, ints, floats, strings), so it can go into a
torch checkpoint as well as into a JSON header (the Keras safetensors metadata).

Call order: ``capture_rng()`` on the training thread at the moment the checkpoint's snapshot
is taken; ``restore_rng(state)`` on the training thread at the point in the resumed run that
corresponds to that moment (for Lightning: ``on_train_start``, after the data loader
iterators were created; see ``docs/reliability.md``). Both are per process (per rank).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = ["RNG_FORMAT", "capture_rng", "restore_rng"]

RNG_FORMAT = "autockpt-rng"
_VERSION = 1


def capture_rng() -> dict[str, Any]:
    """The state of Python's ``random`` and numpy's global generator, as plain JSON."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    inner = np_state["state"]
    return {
        "format": RNG_FORMAT,
        "version": _VERSION,
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": [int(k) for k in inner["key"]],
            "pos": int(inner["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set Python's ``random`` and numpy's global generator to a state from :func:`capture_rng`.

    Raises ``ValueError`` for a state of another format or version (nothing is changed then).
    """
    if not isinstance(state, dict) or state.get("format") != RNG_FORMAT:
        raise ValueError(f"not an autockpt RNG state: {type(state).__name__}")
    if state.get("version") != _VERSION:
        raise ValueError(f"unsupported autockpt RNG state version {state.get('version')!r}")
    py = state["python"]
    np_part = state["numpy"]
    python_state = (int(py["version"]), tuple(int(v) for v in py["state"]), py["gauss"])
    numpy_state = {
        "bit_generator": np_part["bit_generator"],
        "state": {"key": np.asarray(np_part["key"], dtype=np.uint32), "pos": int(np_part["pos"])},
        "has_gauss": int(np_part["has_gauss"]),
        "gauss": float(np_part["gauss"]),
    }
    random.setstate(python_state)
    np.random.set_state(numpy_state)
