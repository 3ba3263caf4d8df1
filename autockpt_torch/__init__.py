"""Torch helpers shared by the torch-based adapters: snapshots into reusable host buffers."""

from .snapshot import save_tree, snapshot_tree, torch_buffer_pool

__all__ = ["save_tree", "snapshot_tree", "torch_buffer_pool"]
