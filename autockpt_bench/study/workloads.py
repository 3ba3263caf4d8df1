"""The study's workloads: the same three models in PyTorch/Lightning and in Keras.

A :class:`Workload` is plain data; both workers (``autockpt_bench.workers.lightning_study``
and ``keras_study``) build their model from it and check that its trainable parameter count
equals :func:`param_count`, so "equivalent in both frameworks" is checked, not assumed.

Architectures (no dropout; float32; Adam):

- ``mlp``: ``layers`` × (Dense(width) + ReLU) from ``features`` inputs, then Dense(classes);
  softmax cross-entropy on integer labels.
- ``cnn`` (ResNet-style, NCHW in torch, NHWC in Keras): stem Conv3×3(3→c0, no bias) + BN + ReLU;
  per stage ``i`` with ``channels[i]`` and ``blocks[i]`` basic blocks: Conv3×3(stride s, no bias)
  + BN + ReLU + Conv3×3(no bias) + BN, plus a shortcut Conv1×1(stride s, no bias) + BN when the
  shape changes (s = 2 for the first block of every stage but the first), add, ReLU; global
  average pool, Dense(classes). BN: eps 1e-5, momentum 0.1 in torch terms (0.9 in Keras).
- ``transformer`` (GPT-style, pre-LayerNorm, causal): token embedding (vocab × d) + learned
  position embedding (seq × d); ``layers`` blocks of LN → multi-head self-attention (q, k, v and
  output projections with biases: 4d² + 4d) → residual, LN → Dense(4d) + GELU → Dense(d) →
  residual; final LN; untied output head Dense(vocab). Next-token cross-entropy.

Data: synthetic, generated with numpy from ``seed`` (:func:`make_data` is the reference; the
workers call it, so both frameworks see identical arrays in identical order).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

KINDS = ("mlp", "cnn", "transformer")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model, its data and batch. ``dims`` holds the kind's sizes (see the module docstring)."""

    name: str
    kind: str
    dims: dict[str, Any]
    batch: int
    steps_per_epoch: int
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"workload {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.batch < 1 or self.steps_per_epoch < 1:
            raise ValueError(f"workload {self.name!r}: batch and steps_per_epoch must be >= 1")

    @property
    def params(self) -> int:
        return param_count(self)

    @property
    def state_bytes(self) -> int:
        """Parameters + Adam's two moments, float32 (what a full checkpoint holds, roughly)."""
        return 12 * self.params

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Workload":
        dims = dict(data["dims"])
        for key in ("channels", "blocks"):
            if key in dims:
                dims[key] = tuple(dims[key])
        return cls(**{**data, "dims": dims})

    def describe(self) -> str:
        d = self.dims
        shape = {
            "mlp": lambda: f"MLP {d['features']}→{d['width']}×{d['layers']}→{d['classes']}",
            "cnn": lambda: f"ResNet-style CNN {d['image']}×{d['image']}, channels {list(d['channels'])}, blocks {list(d['blocks'])}",
            "transformer": lambda: f"transformer d={d['d_model']}, {d['layers']} layers, {d['heads']} heads, "
            f"vocab {d['vocab']}, seq {d['seq']}",
        }[self.kind]()
        return f"{shape}; {self.params / 1e6:.1f}M parameters, batch {self.batch}"


def param_count(w: Workload) -> int:
    """Trainable parameters of the workload's model, as both frameworks count them."""
    d = w.dims
    if w.kind == "mlp":
        n, width = 0, d["features"]
        for _ in range(d["layers"]):
            n += width * d["width"] + d["width"]
            width = d["width"]
        return n + width * d["classes"] + d["classes"]
    if w.kind == "cnn":
        c_prev = d["channels"][0]
        n = 9 * 3 * c_prev + 2 * c_prev  # stem conv + BN
        for stage, (c, blocks) in enumerate(zip(d["channels"], d["blocks"])):
            for b in range(blocks):
                stride = 2 if (b == 0 and stage > 0) else 1
                n += 9 * c_prev * c + 2 * c + 9 * c * c + 2 * c
                if stride != 1 or c_prev != c:
                    n += c_prev * c + 2 * c
                c_prev = c
        return n + c_prev * d["classes"] + d["classes"]
    dm, vocab = d["d_model"], d["vocab"]
    block = (4 * dm * dm + 4 * dm) + (dm * 4 * dm + 4 * dm) + (4 * dm * dm + dm) + 2 * (2 * dm)
    return vocab * dm + d["seq"] * dm + d["layers"] * block + 2 * dm + dm * vocab + vocab


def make_data(w: Workload, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` for ``steps`` batches (float32 inputs / int64 labels; token ids for transformers).

    Images are NHWC; the torch worker transposes them to NCHW.
    """
    rng = np.random.default_rng(w.seed)
    n = steps * w.batch
    d = w.dims
    if w.kind == "mlp":
        x = rng.standard_normal((n, d["features"]), dtype=np.float32)
        proj = rng.standard_normal((d["features"], d["classes"]), dtype=np.float32)
        return x, np.argmax(x @ proj, axis=1).astype(np.int64)
    if w.kind == "cnn":
        x = rng.standard_normal((n, d["image"], d["image"], 3), dtype=np.float32)
        return x, rng.integers(0, d["classes"], size=n).astype(np.int64)
    tokens = rng.integers(0, d["vocab"], size=(n, d["seq"] + 1)).astype(np.int64)
    return tokens[:, :-1], tokens[:, 1:]


# -- presets ----------------------------------------------------------------------------------

FULL = {
    "small": Workload("small", "mlp", {"features": 256, "width": 896, "layers": 2, "classes": 10}, batch=64, steps_per_epoch=200),
    "medium": Workload("medium", "cnn", {"image": 16, "channels": (64, 128, 256, 512), "blocks": (1, 1, 1, 2), "classes": 10},
                       batch=16, steps_per_epoch=100),
    "large": Workload("large", "transformer", {"vocab": 32000, "seq": 32, "d_model": 768, "heads": 12, "layers": 8},
                      batch=2, steps_per_epoch=50, lr=3e-4),
}

#: ``--quick``'s workloads: the same three kinds, scaled down (``autockpt compare --quick`` runs the
#: small one unless ``--workloads`` names others: about 2 minutes on a 2-core CPU).
QUICK = {
    "small": Workload("small", "mlp", {"features": 64, "width": 256, "layers": 2, "classes": 10}, batch=32, steps_per_epoch=60),
    "medium": Workload("medium", "cnn", {"image": 8, "channels": (16, 32, 64, 128), "blocks": (1, 1, 1, 1), "classes": 10},
                       batch=8, steps_per_epoch=40),
    "large": Workload("large", "transformer", {"vocab": 4000, "seq": 16, "d_model": 256, "heads": 4, "layers": 4},
                      batch=2, steps_per_epoch=30, lr=3e-4),
}


def preset(quick: bool) -> dict[str, Workload]:
    return dict(QUICK if quick else FULL)
