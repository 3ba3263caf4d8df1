"""Torch helpers shared by the torch-based adapters: snapshots into reusable host buffers,
overlapped with the next step (CPU helper thread, CUDA stream or GPU-side copy), and
torch.save of the copies; ``rng``: capture/restore of the Python, numpy, torch and CUDA
generators; ``ResumableSampler``: a shuffling sampler a resumed run continues mid-epoch."""

from .host_buffers import torch_buffer_pool, torch_shared_pool
from .modes import ModeChoice, auto_candidates, choose_mode, cpu_default_mode
from .pending import PendingCopy
from .rng import capture_rng, restore_rng
from .sampler import ResumableSampler
from .snapshot import WRITE_TREE, save_tree, snapshot_tree, write_tree
from .staging import TorchSnapshotter

__all__ = [
    "WRITE_TREE",
    "ModeChoice",
    "PendingCopy",
    "ResumableSampler",
    "TorchSnapshotter",
    "auto_candidates",
    "capture_rng",
    "choose_mode",
    "cpu_default_mode",
    "restore_rng",
    "save_tree",
    "snapshot_tree",
    "torch_buffer_pool",
    "torch_shared_pool",
    "write_tree",
]
