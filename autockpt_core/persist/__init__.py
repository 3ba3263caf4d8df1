"""Where bytes are written: buffers, tensor files, checksums, storage, manifest, the writer.

- :mod:`.buffers`: reusable host buffers the snapshot copies into (phase 1).
- :mod:`.tree`: walking nested state and replacing tensor leaves (used by the adapters' copy).
- :mod:`.tensorfile`: streaming safetensors files; :mod:`.checksum`: CRC-32 while writing.
- :mod:`.storage`: one interface for local directories and fsspec URLs (atomic writes).
- :mod:`.manifest`: the list of committed checkpoints in commit order, verified on load.
  :mod:`.whole_read`: a resume's single pass over the file it loads, verifying as it reads;
  :mod:`.verified_fetch`: a resume's single download of a checkpoint under a URL.
- :mod:`.writer`: phase 2, the background persist: write, commit, then :mod:`.retention`;
  :mod:`.failures`: what a failed persist left, in its message.
- :mod:`.mirror`: a second tier each committed checkpoint is copied to in the background;
  :mod:`.tiers`: copying between tiers, and which tier's checkpoint a resume takes.
- :mod:`.directory`: taking a directory into use (at session start): :mod:`.lock`, one
  writer per directory; a probe write; :mod:`.leftovers`, what interrupted writes left.
- :mod:`.names`: checkpoint file names.

Imports only ``autockpt_core``'s base modules (errors, units); never the policy, the engine or
the command line.
"""

from .buffers import BufferPool
from .manifest import MANIFEST_NAME, CheckpointRecord, find_latest_valid, local_size_problem, read_manifest, verify
from .storage import FsspecStorage, LocalStorage, Storage, WriteResult, location_of, storage_for
from .tensorfile import read_tensor_file, write_tensor_file
from .writer import CheckpointWriter, PersistJob

__all__ = [
    "MANIFEST_NAME",
    "BufferPool",
    "CheckpointRecord",
    "CheckpointWriter",
    "FsspecStorage",
    "LocalStorage",
    "PersistJob",
    "Storage",
    "WriteResult",
    "find_latest_valid",
    "local_size_problem",
    "location_of",
    "read_manifest",
    "read_tensor_file",
    "storage_for",
    "verify",
    "write_tensor_file",
]
