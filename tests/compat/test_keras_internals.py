"""Canaries for every private name the Keras adapter reads (``autockpt_keras.internals``), and what
a release that renamed one would do.

Run against a new Keras, TensorFlow or torch before listing it as tested:
``python -m pytest tests/compat``. Each backend runs in a process of its own
(``keras_internals_worker.py``).

1. Each name exists on the installed releases with the shape the adapter expects, read from real
   fits (arrays, tf.data and a torch DataLoader on TensorFlow; arrays on torch and JAX) under
   the table's name, at the hook where the adapter reads it.
2. Each name renamed (simulated: the door looks for another attribute name) gives a named error
   at ``fit()``'s start (``Model._initial_epoch``, without which no resume is possible) or a named
   warning and a fit that still trains, saves and resumes mid-epoch, never an ``AttributeError``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("keras")
pytest.importorskip("tensorflow")

from autockpt_keras import internals  # noqa: E402

WORKER = Path(__file__).with_name("keras_internals_worker.py")
ROOT = Path(__file__).resolve().parents[2]
HAS_JAX = importlib.util.find_spec("jax") is not None
JAX_KEYS = {"jax_state", "jax_state_synced", "stateless_scope"}


def _run(backend: str, out: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(WORKER), *args[:1], str(out), *args[1:]], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


BACKENDS = ["tensorflow", "torch"] + (["jax"] if HAS_JAX else [])


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("canaries")
    return {backend: _run(backend, root / f"{backend}.json", "canaries") for backend in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
def test_canary_every_name_is_there_with_its_shape(backend: str, canaries: dict[str, dict[str, Any]]) -> None:
    failed = {key: detail for key, (ok, detail) in canaries[backend].items() if not ok}
    labels = {key: internals.INTERNALS[key].label for key in failed if key in internals.INTERNALS}
    assert not failed, (failed, labels)


def test_every_internal_has_a_canary(canaries: dict[str, dict[str, Any]]) -> None:
    read = {key for found in canaries.values() for key in found}
    expected = set(internals.INTERNALS) - (set() if HAS_JAX else {"jax_state", "jax_state_synced"})
    assert expected <= read, expected - read


# -- a release that renamed one --------------------------------------------------------------------


TF_KEYS = sorted(set(internals.INTERNALS) - JAX_KEYS)


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("renamed")
    found = {}
    found.update(_run("tensorflow", root / "tensorflow.json", "renamed", ",".join(TF_KEYS)))
    if HAS_JAX:
        found.update(_run("jax", root / "jax.json", "renamed", ",".join(sorted(JAX_KEYS))))
    return found


REQUIRED = sorted(k for k, i in internals.INTERNALS.items() if i.required)
OPTIONAL = sorted(k for k, i in internals.INTERNALS.items() if not i.required)


@pytest.mark.parametrize("key", REQUIRED)
def test_a_renamed_required_internal_stops_the_fit_at_its_start_naming_it(
    key: str, renamed: dict[str, dict[str, Any]]
) -> None:
    report = renamed[key]
    assert report["error"] is not None and report["error"].startswith("AutockptError: autockpt cannot run on Keras")
    assert internals.INTERNALS[key].label in report["error"]
    assert report["steps"] == []  # nothing trained


@pytest.mark.parametrize("key", OPTIONAL)
def test_a_renamed_internal_is_named_and_the_fit_trains_saves_and_resumes(
    key: str, renamed: dict[str, dict[str, Any]]
) -> None:
    if key not in renamed:
        pytest.skip(f"{key}: its backend is not installed")
    report = renamed[key]
    assert report["error"] is None, report["error"]
    assert any(internals.INTERNALS[key].label in message for message in report["told"]), report["told"]
    assert report["steps"] == [5, 16] and report["resumed"] == 5
