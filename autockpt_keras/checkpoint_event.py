"""What the Keras callback records per checkpoint (``AutoCheckpoint.events``):
:class:`autockpt_core.checkpoint_event.CheckpointEvent`, shared with the Lightning callback."""

from autockpt_core.checkpoint_event import CheckpointEvent

__all__ = ["CheckpointEvent"]
