"""autockpt for Lightning: automatic, crash-safe checkpointing in two lines.

    from autockpt_lightning import AutoCheckpoint
    trainer = Trainer(callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])

``ResumableSampler`` makes a plain ``DataLoader`` resume mid-epoch exactly
(``DataLoader(dataset, batch_size=32, sampler=ResumableSampler(dataset, seed=0))``).
"""

from autockpt_torch import ResumableSampler

from .callback import AutoCheckpoint
from .checkpoint_file import latest_checkpoint

__all__ = ["AutoCheckpoint", "ResumableSampler", "latest_checkpoint"]
