"""autockpt core: framework-free policy, persistence and command line.

Three parts, one folder each (dependencies point one way: ``cli`` -> engine -> ``policy`` /
``persist``):

- ``policy/``: where a decision is made (profiler, intervals, adjusters, simulator); pure.
- ``persist/``: where bytes are written (buffers, tensor files, checksums, storage, manifest,
  the background writer).
- ``cli/``: where a command lives (``autockpt plan|simulate|inspect|bench|demo``).

At the top: the engine that ties them (:mod:`.session`, :mod:`.summary`), and what every part
may use: :mod:`.config`, :mod:`.units`, :mod:`.errors`, :mod:`.preemption`, :mod:`.rng`.
Imports no torch, tensorflow, keras, lightning or jax. The adapters (``autockpt_lightning``,
``autockpt_keras``) drive a :class:`CheckpointSession`.
"""

from .config import Config
from .errors import (
    AutockptError,
    CheckpointWriteError,
    ConfigError,
    DirectoryLockedError,
    MirrorWriteError,
    ResumeNotExactWarning,
)
from .persist import (
    MANIFEST_NAME,
    BufferPool,
    CheckpointRecord,
    CheckpointWriter,
    FsspecStorage,
    LocalStorage,
    PersistJob,
    Storage,
    WriteResult,
    find_latest_valid,
    read_manifest,
    read_tensor_file,
    storage_for,
    verify,
    write_tensor_file,
)
from .persist.names import checkpoint_name
from .policy import CheckpointPolicy, Decision, Estimates, IntervalChoice, IntervalRules, Profiler, choose_interval
from .policy.intervals import (
    budget_interval_steps,
    daly_interval,
    persist_interval_steps,
    seconds_to_steps,
    young_interval,
)
from .preemption import Preempted, PreemptionHandler, PreemptionRecord
from .session import CheckpointSession, PendingCopy, Snapshot
from .summary import RunSummary
from .units import parse_duration, parse_fraction, parse_size

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
    "Decision",
    "DirectoryLockedError",
    "MirrorWriteError",
    "Estimates",
    "FsspecStorage",
    "IntervalChoice",
    "LocalStorage",
    "MANIFEST_NAME",
    "PendingCopy",
    "PersistJob",
    "Preempted",
    "PreemptionHandler",
    "PreemptionRecord",
    "Profiler",
    "ResumeNotExactWarning",
    "RunSummary",
    "Snapshot",
    "Storage",
    "WriteResult",
    "budget_interval_steps",
    "checkpoint_name",
    "IntervalRules",
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
