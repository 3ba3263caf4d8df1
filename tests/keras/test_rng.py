"""The global generators a Keras process draws from (``autockpt_keras/rng.py``), across the
Keras releases of the support window: Keras 3.5 names the global SeedGenerator's attribute
with a plain string, later releases with the ``GLOBAL_SEED_GENERATOR`` constant."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from autockpt_keras import rng  # noqa: E402


def draw() -> list[float]:
    return [float(v) for v in keras.ops.convert_to_numpy(keras.random.uniform((3,)))]


@pytest.mark.parametrize("constant", [True, False], ids=["GLOBAL_SEED_GENERATOR", "keras-3.5-string"])
def test_the_global_seed_generator_is_captured_and_restored(monkeypatch: pytest.MonkeyPatch, constant: bool) -> None:
    from keras.src.random import seed_generator

    keras.utils.set_random_seed(3)
    draw()  # the global SeedGenerator exists and has moved
    with monkeypatch.context() as patch:
        if not constant:  # Keras 3.5: no constant; the attribute is named by this same string
            assert getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator") == "global_seed_generator"
            patch.delattr(seed_generator, "GLOBAL_SEED_GENERATOR", raising=False)
        state = rng.capture(keras.backend.backend())
    assert state.get("keras_seed")
    expected = draw()
    draw()
    rng.restore(state, keras.backend.backend())
    assert draw() == expected
