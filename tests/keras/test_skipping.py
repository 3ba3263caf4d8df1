"""autockpt_keras.skipping.build_metrics: the compiled metrics and loss exist before the first
step (a resumed epoch assigns their checkpoint values in on_train_begin), built from a
functional model's symbolic output without a second symbolic pass through its layers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras  # noqa: E402

from autockpt_keras.skipping import build_metrics  # noqa: E402

BATCH = (keras.KerasTensor((None, 6), "float32"), keras.KerasTensor((None,), "int32"))


def functional() -> keras.Model:
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs))
    return keras.Model(inputs, outputs)


def sequential() -> keras.Model:
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))


def compiled(model: keras.Model) -> keras.Model:
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(), keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    return model


def metric_state(model: keras.Model) -> list[tuple[str, tuple[int, ...]]]:
    return [(v.path, tuple(v.shape)) for v in model.metrics_variables]


@pytest.mark.parametrize("make", [functional, sequential])
def test_a_functional_model_builds_its_metrics_from_its_output(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    keras.utils.clear_session()
    reference = compiled(make())
    reference._symbolic_build(data_batch=BATCH)  # what Keras builds
    keras.utils.clear_session()
    model = compiled(make())
    assert not model._compile_metrics.built and not model._compile_loss.built
    monkeypatch.setattr(model, "_symbolic_build", lambda **kw: pytest.fail("symbolic pass through the layers"))
    assert build_metrics(model, None, batch=BATCH)
    assert model._compile_metrics.built and model._compile_loss.built
    assert metric_state(model) == metric_state(reference)
    x, y = np.ones((4, 6), np.float32), np.array([0, 1, 2, 1], np.int32)
    assert model.evaluate(x, y, verbose=0, return_dict=True).keys() == reference.evaluate(x, y, verbose=0, return_dict=True).keys()


def test_a_subclassed_model_takes_keras_symbolic_build() -> None:
    model = compiled(Subclassed())
    model(np.ones((1, 6), np.float32))  # every layer built: still no symbolic output
    calls: list[Any] = []
    build = model._symbolic_build
    model._symbolic_build = lambda **kw: (calls.append(kw), build(**kw))[1]  # type: ignore[method-assign]
    assert build_metrics(model, None, batch=BATCH)
    assert calls and model._compile_metrics.built and model._compile_loss.built
