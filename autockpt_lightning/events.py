"""What the Lightning callback reports about the checkpoints it took (``AutoCheckpoint.events``):
:class:`autockpt_core.checkpoint_event.CheckpointEvent`, shared with the Keras callback."""

from autockpt_core.checkpoint_event import CheckpointEvent

__all__ = ["CheckpointEvent"]
