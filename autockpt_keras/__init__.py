"""autockpt for Keras 3: automatic, crash-safe checkpointing of ``model.fit()``.

>>> model.fit(x, y, epochs=10, callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])

Rerunning the same script resumes from the newest valid checkpoint in ``ckpts``. Works on
the TensorFlow, torch and JAX backends (chosen with ``KERAS_BACKEND`` before importing keras).
Checkpoints are safetensors files; ``export_weights`` writes a plain Keras ``.weights.h5``.
"""

from .callback import AutoCheckpoint, CheckpointEvent
from .checkpoint_file import CheckpointInfo, latest_checkpoint, load_checkpoint
from .export import export_weights, restore
from .state import StateMismatchError

__all__ = [
    "AutoCheckpoint",
    "CheckpointEvent",
    "CheckpointInfo",
    "StateMismatchError",
    "export_weights",
    "latest_checkpoint",
    "load_checkpoint",
    "restore",
]
