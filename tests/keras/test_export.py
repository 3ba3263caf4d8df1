"""``autockpt export`` of really trained Keras checkpoints (autockpt_keras/export.py:
``model_arrays``, ``load_into``): ``.safetensors`` without a model, ``.weights.h5`` and ``.keras``
with ``--model``, each holding the model's variables at the checkpoint's step.

``export_worker.py`` trains a tiny model on the TensorFlow backend in a child process (checkpoints
at steps 3, 6 and the final 8) and keeps its variables after every step; the ``.safetensors``
export runs through the console script; the Keras files are exported in this process and loaded
by plain Keras in a child process that never imports autockpt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.console import autockpt

pytestmark = [
    pytest.mark.integration,
    # build_model() for --model, in a process that built it already: Keras names the layers anew
    pytest.mark.filterwarnings("ignore:autockpt. variable names differ:RuntimeWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("export_worker.py")
ENV = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1",
       "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}

LOAD = """
import json, sys
import keras, numpy as np
sys.path.insert(0, "tests/keras")
from export_worker import build_model

model = keras.models.load_model(sys.argv[1])
fresh = build_model()
fresh.optimizer.build(fresh.trainable_variables)
fresh.load_weights(sys.argv[2])
np.savez(sys.argv[3], *[v.numpy() for v in model.variables], *[v.numpy() for v in fresh.variables])
print(json.dumps({
    "iterations": [int(model.optimizer.iterations.numpy()), int(fresh.optimizer.iterations.numpy())],
    "autockpt": sorted(m for m in sys.modules if m.startswith("autockpt")),
}))
"""


def train(ck: Path, backend: str) -> tuple[Path, dict[int, dict[str, np.ndarray]]]:
    """Train in a child process on ``backend``: the checkpoint directory, and the model's
    variables (by path) after each step."""
    ck.mkdir(parents=True)
    done = subprocess.run([sys.executable, str(WORKER), str(ck)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **ENV, "KERAS_BACKEND": backend})
    assert done.returncode == 0, done.stderr[-4000:]
    steps: dict[int, dict[str, np.ndarray]] = {}
    with np.load(ck / "steps.npz") as saved:
        for key in saved.files:
            step, path = key.split("/", 1)
            steps.setdefault(int(step), {})[path] = saved[key]
    return ck, steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, np.ndarray]]]:
    return train(tmp_path_factory.mktemp("keras-export") / "ck", "tensorflow")


def test_a_safetensors_export_of_a_step_needs_no_model(trained: Any, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    ck, steps = trained
    out = tmp_path / "weights.safetensors"
    done = autockpt("export", str(ck), str(out), "--step", "3", env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.fullmatch(
        rf"wrote {re.escape(str(out))} \(\d+\.\dKB\): the Keras model's variables \(8 arrays\) of step 3 "
        rf"from {re.escape(str(ck))}/ckpt-step000000003.safetensors\n",
        done.stdout,
    ), done.stdout
    exported = load_file(out)
    assert list(exported) == list(steps[3])  # variable paths, in the model's order
    for path, value in steps[3].items():
        assert np.array_equal(exported[path], value), path
    assert not np.array_equal(steps[3]["sequential/dense/kernel"], steps[8]["sequential/dense/kernel"])
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert {k: meta[k] for k in ("framework", "step", "backend", "source")} == {
        "framework": "keras", "step": "3", "backend": "tensorflow", "source": "ckpt-step000000003.safetensors"
    }


def test_weights_and_model_files_load_in_plain_keras(
    trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autockpt_bench import cli

    ck, steps = trained
    monkeypatch.chdir(ROOT)  # --model's module form imports from the working directory
    model_file, weights_file = tmp_path / "model.keras", tmp_path / "model.weights.h5"
    script_form = "tests/keras/export_worker.py:build_model"
    assert cli.main(["export", str(ck), str(model_file), "--step", "6", "--model", script_form]) == 0
    assert cli.main(["export", str(ck), str(weights_file), "--model", "tests.keras.export_worker:build_model"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        rf"wrote {re.escape(str(model_file))} \(\d+\.\dKB\): Keras model of step 6 "
        rf"from {re.escape(str(ck))}/ckpt-step000000006.safetensors, "
        r"in the model build_model\(\) built, with its optimizer state",
        printed[0],
    ), printed[0]
    assert re.fullmatch(
        rf"wrote {re.escape(str(weights_file))} \(\d+\.\dKB\): Keras weights of step 8 "
        rf"from {re.escape(str(ck))}/ckpt-step000000008.safetensors, "
        r"in the model build_model\(\) built, with its optimizer state",
        printed[1],
    ), printed[1]

    arrays = tmp_path / "loaded.npz"
    done = subprocess.run([sys.executable, "-c", LOAD, str(model_file), str(weights_file), str(arrays)], cwd=ROOT,
                          env={**os.environ, **ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded == {"iterations": [6, 8], "autockpt": []}
    with np.load(arrays) as saved:
        values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    expected = [*steps[6].values(), *steps[8].values()]
    assert len(values) == len(expected)
    for got, want in zip(values, expected):
        assert np.array_equal(got, want)


def test_a_model_function_that_returns_an_unbuilt_model_is_one_line(
    trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autockpt_bench import cli

    script = tmp_path / "unbuilt.py"
    script.write_text("import keras\n\ndef build():\n    return keras.Sequential([keras.layers.Dense(1)])\n")
    assert cli.main(["export", str(trained[0]), str(tmp_path / "m.keras"), "--model", f"{script}:build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autockpt export: error: cannot restore into model 'sequential") and "not built" in err
    assert err.count("\n") == 1
    assert cli.main(["export", str(trained[0]), str(tmp_path / "m.keras"), "--model", f"{script}:nothing"]) == 2
    assert capsys.readouterr().err == f"autockpt export: error: --model {script}:nothing: {script} has no function nothing\n"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_checkpoint_of_the_torch_backend_exports_in_this_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written on the torch backend, exported and loaded here (TensorFlow, unless KERAS_BACKEND says otherwise)."""
    import keras

    from autockpt_bench import cli

    ck, steps = train(tmp_path / "ck", "torch")
    out = tmp_path / "model.keras"
    assert cli.main(["export", str(ck), str(out), "--model", f"{WORKER}:build_model"]) == 0
    assert f"of step 8 from {ck}/ckpt-step000000008.safetensors" in capsys.readouterr().out
    model = keras.models.load_model(out)
    assert int(model.optimizer.iterations.numpy()) == 8
    for variable, value in zip(model.variables, steps[8].values(), strict=True):
        assert np.array_equal(variable.numpy(), value), variable.path
