"""autockpt for Lightning: automatic, crash-safe checkpointing in two lines.

    from autockpt_lightning import AutoCheckpoint
    trainer = Trainer(callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
"""

from .callback import AutoCheckpoint, latest_checkpoint

__all__ = ["AutoCheckpoint", "latest_checkpoint"]
