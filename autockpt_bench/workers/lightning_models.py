"""The study's three workloads as PyTorch modules, trained by one LightningModule (see ``workloads``).

Imported only by the Lightning study worker (:mod:`.lightning_study`) and by tests. Every
architecture follows the :mod:`autockpt_bench.study.workloads` docstring; :class:`StudyModule`
checks its trainable parameter count against :func:`~autockpt_bench.study.workloads.param_count`.
The module calls an optional ``probe`` from its training hooks: LightningModule hooks run after
every callback's hook of the same name, so the probe sees each step with all checkpoint work
of that hook done.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ..study.workloads import Workload, make_data, param_count


class MLP(nn.Module):
    def __init__(self, features: int, width: int, layers: int, classes: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        n = features
        for _ in range(layers):
            blocks += [nn.Linear(n, width), nn.ReLU()]
            n = width
        blocks.append(nn.Linear(n, classes))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int) -> list[nn.Module]:
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return [conv, nn.BatchNorm2d(c_out, eps=1e-5, momentum=0.1)]


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(c_in, c_out, 3, stride), nn.ReLU(), *_conv_bn(c_out, c_out, 3, 1))
        self.shortcut = nn.Sequential(*_conv_bn(c_in, c_out, 1, stride)) if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + skip)


class ResNet(nn.Module):
    """NCHW input (the worker transposes ``make_data``'s NHWC images once)."""

    def __init__(self, channels: tuple[int, ...], blocks: tuple[int, ...], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, channels[0], 3, 1), nn.ReLU()]
        c_prev = channels[0]
        for stage, (c, n) in enumerate(zip(channels, blocks)):
            for b in range(n):
                layers.append(BasicBlock(c_prev, c, 2 if (b == 0 and stage > 0) else 1))
                c_prev = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_prev, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class Block(nn.Module):
    """Pre-LN: x + attn(LN(x)) with a causal mask, then x + MLP(LN(x)) (Dense(4d), GELU, Dense(d))."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab)  # untied from the token embedding
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(n, device=tokens.device))
        mask = self.mask[:n, :n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def build_net(workload: Workload) -> nn.Module:
    """The workload's model, seeded with ``workload.seed``; raises when its count differs from param_count."""
    torch.manual_seed(workload.seed)
    d = workload.dims
    net: nn.Module
    if workload.kind == "mlp":
        net = MLP(d["features"], d["width"], d["layers"], d["classes"])
    elif workload.kind == "cnn":
        net = ResNet(tuple(d["channels"]), tuple(d["blocks"]), d["classes"])
    else:
        net = GPT(d["vocab"], d["seq"], d["d_model"], d["heads"], d["layers"])
    got = sum(p.numel() for p in net.parameters() if p.requires_grad)
    want = param_count(workload)
    if got != want:
        raise RuntimeError(f"workload {workload.name!r} ({workload.kind}): the torch model has {got} trainable "
                           f"parameters, param_count says {want}: the two definitions disagree")
    return net


class StudyModule(pl.LightningModule):
    """The workload's net with Adam(lr) and cross-entropy; ``probe`` (optional) gets
    ``train_start(trainer)`` and ``batch_end(trainer)`` from this module's hooks."""

    def __init__(self, workload: Workload, probe: Any = None) -> None:
        super().__init__()
        self.net = build_net(workload)
        self.lr = workload.lr
        self.probe = probe

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def on_train_start(self) -> None:
        if self.probe is not None:
            self.probe.train_start(self.trainer)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.probe is not None:
            self.probe.batch_end(self.trainer)


def loader(workload: Workload) -> StatefulDataLoader:
    """One epoch = ``make_data(workload, steps_per_epoch)`` in order (images transposed to NCHW)."""
    x, y = make_data(workload, workload.steps_per_epoch)
    if workload.kind == "cnn":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return StatefulDataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=workload.batch, shuffle=False)


def trainable_weights(module: nn.Module) -> list[np.ndarray]:
    """Trainable parameters in ``parameters()`` order, as numpy copies."""
    return [p.detach().cpu().numpy().copy() for p in module.parameters() if p.requires_grad]


def state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every model tensor (parameters and buffers such as BN statistics) + optimizer state."""
    tensors = [t for t in module.state_dict().values() if torch.is_tensor(t)]
    tensors += [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)
