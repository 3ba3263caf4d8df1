"""Keras 3 versions of the study's three models (:mod:`autockpt_bench.study.workloads`).

Imported only by :mod:`.keras_study` (a worker process: ``KERAS_BACKEND`` and the thread
settings are fixed before this module imports Keras). :func:`build_model` builds and compiles
the workload's model (Adam with ``workload.lr``, ``SparseCategoricalCrossentropy(
from_logits=True)``) from ``keras.utils.set_random_seed(workload.seed)`` and checks that its
trainable parameter count is :func:`~autockpt_bench.study.workloads.param_count`.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import layers

from ..study.workloads import Workload, param_count

BN = {"epsilon": 1e-5, "momentum": 0.9}
LN = {"epsilon": 1e-5}


@keras.saving.register_keras_serializable(package="autockpt_study")
class PositionEmbedding(layers.Layer):
    """Adds a learned ``(seq, d)`` position embedding to a ``(batch, seq, d)`` input."""

    def __init__(self, seq: int, d_model: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq, self.d_model = seq, d_model

    def build(self, input_shape: Any) -> None:
        self.positions = self.add_weight(
            shape=(self.seq, self.d_model), initializer=keras.initializers.RandomNormal(stddev=0.02), name="positions"
        )

    def call(self, x: Any) -> Any:
        return x + self.positions

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seq": self.seq, "d_model": self.d_model}


def _mlp(d: dict[str, Any]) -> keras.Model:
    inputs = keras.Input((d["features"],), name="x")
    h = inputs
    for i in range(d["layers"]):
        h = layers.Dense(d["width"], activation="relu", name=f"dense_{i}")(h)
    return keras.Model(inputs, layers.Dense(d["classes"], name="head")(h), name="mlp")


def _conv_bn(x: Any, channels: int, kernel: int, stride: int, name: str) -> Any:
    x = layers.Conv2D(channels, kernel, strides=stride, padding="same", use_bias=False, name=f"{name}_conv")(x)
    return layers.BatchNormalization(name=f"{name}_bn", **BN)(x)


def _cnn(d: dict[str, Any]) -> keras.Model:
    inputs = keras.Input((d["image"], d["image"], 3), name="x")
    channels = list(d["channels"])
    h = layers.ReLU(name="stem_relu")(_conv_bn(inputs, channels[0], 3, 1, "stem"))
    c_prev = channels[0]
    for stage, (c, blocks) in enumerate(zip(channels, d["blocks"])):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            name = f"s{stage}b{b}"
            y = layers.ReLU(name=f"{name}_relu1")(_conv_bn(h, c, 3, stride, f"{name}_1"))
            y = _conv_bn(y, c, 3, 1, f"{name}_2")
            shortcut = _conv_bn(h, c, 1, stride, f"{name}_short") if (stride != 1 or c_prev != c) else h
            h = layers.ReLU(name=f"{name}_relu2")(layers.Add(name=f"{name}_add")([y, shortcut]))
            c_prev = c
    h = layers.GlobalAveragePooling2D(name="pool")(h)
    return keras.Model(inputs, layers.Dense(d["classes"], name="head")(h), name="cnn")


def _transformer(d: dict[str, Any]) -> keras.Model:
    dm, heads = d["d_model"], d["heads"]
    inputs = keras.Input((d["seq"],), dtype="int32", name="tokens")
    h = layers.Embedding(d["vocab"], dm, name="tokens_embedding")(inputs)
    h = PositionEmbedding(d["seq"], dm, name="positions")(h)
    for i in range(d["layers"]):
        a = layers.LayerNormalization(name=f"b{i}_ln1", **LN)(h)
        a = layers.MultiHeadAttention(num_heads=heads, key_dim=dm // heads, name=f"b{i}_attn")(a, a, use_causal_mask=True)
        h = layers.Add(name=f"b{i}_res1")([h, a])
        m = layers.LayerNormalization(name=f"b{i}_ln2", **LN)(h)
        m = layers.Dense(4 * dm, activation="gelu", name=f"b{i}_fc")(m)
        m = layers.Dense(dm, name=f"b{i}_proj")(m)
        h = layers.Add(name=f"b{i}_res2")([h, m])
    h = layers.LayerNormalization(name="ln_f", **LN)(h)
    return keras.Model(inputs, layers.Dense(d["vocab"], name="head")(h), name="transformer")


def build_model(workload: Workload, compile: bool = True) -> keras.Model:
    """The workload's model (compiled unless ``compile=False``), seeded from ``workload.seed``."""
    keras.utils.set_random_seed(workload.seed)
    model = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer}[workload.kind](dict(workload.dims))
    check_params(model, workload)
    if compile:
        compile_model(model, workload)
    return model


def compile_model(model: keras.Model, workload: Workload) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=workload.lr, name="adam"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def trainable_params(model: keras.Model) -> int:
    return sum(_size(v.shape) for v in model.trainable_weights)


def _size(shape: Any) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def check_params(model: keras.Model, workload: Workload) -> None:
    got, want = trainable_params(model), param_count(workload)
    if got != want:
        raise AssertionError(
            f"workload {workload.name!r} ({workload.kind}): the Keras model has {got:,} trainable parameters, "
            f"param_count() says {want:,}; the Keras model and the workload's architecture disagree"
        )


def state_bytes(model: keras.Model) -> int:
    """Bytes of every model variable and optimizer variable."""
    import numpy as np

    variables = list(model.variables) + list(model.optimizer.variables if model.optimizer is not None else [])
    return sum(_size(v.shape) * np.dtype(v.dtype).itemsize for v in variables)
