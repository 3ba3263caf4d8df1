"""autockpt core: framework-free policy, profiler, buffers, writer and storage.

Imports no torch, tensorflow, keras or lightning. The adapters (``autockpt_lightning``,
``autockpt_keras``) drive a :class:`CheckpointSession`.
"""

from .buffers import BufferPool
from .config import Config
from .errors import AutockptError, CheckpointWriteError, ConfigError, CorruptCheckpointError, ResumeNotExactWarning
from .intervals import (
    budget_interval_steps,
    daly_interval,
    persist_interval_steps,
    seconds_to_steps,
    young_interval,
)
from .manifest import MANIFEST_NAME, CheckpointRecord, find_latest_valid, read_manifest, verify
from .preemption import Preempted, PreemptionHandler
from .policy import CheckpointPolicy, Decision, IntervalChoice, choose_interval
from .profiler import Estimates, Profiler
from .session import CheckpointSession, PendingCopy, Snapshot, checkpoint_name
from .storage import FsspecStorage, LocalStorage, Storage, WriteResult, storage_for
from .summary import RunSummary
from .tensorfile import read_tensor_file, write_tensor_file
from .units import parse_duration, parse_fraction, parse_size
from .writer import CheckpointWriter, PersistJob

__version__ = "0.1.0"

__all__ = [
    "AutockptError",
    "BufferPool",
    "CheckpointPolicy",
    "CheckpointRecord",
    "CheckpointSession",
    "CheckpointWriteError",
    "CheckpointWriter",
    "Config",
    "ConfigError",
    "CorruptCheckpointError",
    "Decision",
    "Estimates",
    "FsspecStorage",
    "IntervalChoice",
    "LocalStorage",
    "MANIFEST_NAME",
    "PendingCopy",
    "PersistJob",
    "Preempted",
    "PreemptionHandler",
    "Profiler",
    "ResumeNotExactWarning",
    "RunSummary",
    "Snapshot",
    "Storage",
    "WriteResult",
    "budget_interval_steps",
    "checkpoint_name",
    "choose_interval",
    "daly_interval",
    "find_latest_valid",
    "parse_duration",
    "parse_fraction",
    "parse_size",
    "persist_interval_steps",
    "read_manifest",
    "read_tensor_file",
    "seconds_to_steps",
    "storage_for",
    "verify",
    "write_tensor_file",
    "young_interval",
]
