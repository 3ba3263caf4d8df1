"""The Keras checkpoint file: a standard safetensors file plus string metadata.

Tensors are stored under the keys of :mod:`autockpt_keras.state` (``model/...``,
``optimizer/...``, ``metrics/...``). The safetensors header's ``__metadata__`` holds:

``format`` ("autockpt-keras"), ``format_version`` ("1"), ``step`` (optimizer iterations),
``epoch`` (0-based epoch the step belongs to), ``batch`` (0-based batch index in that epoch,
"-1" if unknown), ``next_epoch`` (the epoch ``fit()`` resumes at), ``backend``,
``keras_version``, ``variables`` (JSON list of the keys in collection order) and, from
format version 2, ``resume``: the JSON of a :class:`~autockpt_keras.resume_point.ResumePoint` (the
batch position in the data stream and the global generators' states), which exact mid-epoch
resume needs. Version 1 files (no ``resume``) resume at the start of ``next_epoch``. A file
written by a job over several JAX processes also holds ``resume_processes``: a JSON list of
every process's resume point (each process's own generators), in process order.

Any safetensors reader opens the file (``safetensors.numpy.load_file``); the writer streams
from the snapshot buffers (``autockpt_core.write_tensor_file``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Mapping

import numpy as np

from autockpt_core import (
    CheckpointRecord,
    ResumeNotExactWarning,
    Snapshot,
    find_latest_valid,
    read_tensor_file,
    storage_for,
)
from autockpt_core.persist import Storage, location_of
from autockpt_core.persist.persist_process import PortableWrite
from autockpt_core.persist.tensorfile import WRITE_TENSORS
from autockpt_core.persist.whole_read import map_file

from .resume_point import ResumePoint

FRAMEWORK = "keras"
SUFFIX = ".safetensors"
FORMAT = "autockpt-keras"
FORMAT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a Keras checkpoint file says about itself."""

    path: str
    step: int
    epoch: int | None
    batch: int | None
    next_epoch: int
    backend: str | None
    keras_version: str | None
    keys: tuple[str, ...]
    resume: ResumePoint | None = None
    process_points: tuple[ResumePoint, ...] = ()  # every process's, for a multi-process job

    def __repr__(self) -> str:  # the keys (one per array) and every process's point only counted
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.name not in ("keys", "process_points"))
        return f"CheckpointInfo({', '.join(shown)}, keys=<{len(self.keys)} arrays>, process_points=<{len(self.process_points)}>)"

    def for_process(self, index: int, count: int) -> "CheckpointInfo":
        """This info with ``resume`` the point of process ``index`` of ``count``.

        A file written by as many processes gives each its own (its generators); one written by
        another number of processes gives process 0's to all, with a
        :class:`~autockpt_core.ResumeNotExactWarning` (each process's data and generators differ).
        """
        if len(self.process_points) == count and count > 1:
            return dataclasses.replace(self, resume=self.process_points[index])
        written = max(1, len(self.process_points))
        if written != count and self.resume is not None:
            warnings.warn(
                f"autockpt: resuming at step {self.step} is not exact: the checkpoint was written by a job "
                f"of {written} process(es), this one has {count}; every process takes process 0's "
                "generator states and batch position.",
                ResumeNotExactWarning,
                stacklevel=3,
            )
        return self


def file_metadata(
    *, step: int, epoch: int | None, batch: int | None, next_epoch: int, backend: str, keras_version: str,
    keys: list[str], resume: ResumePoint | None = None, process_points: list[str] | None = None,
) -> dict[str, str]:
    """The safetensors ``__metadata__`` (strings only) for one checkpoint."""
    meta = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "step": str(step),
        "epoch": "-1" if epoch is None else str(epoch),
        "batch": "-1" if batch is None else str(batch),
        "next_epoch": str(next_epoch),
        "backend": backend,
        "keras_version": keras_version,
        "variables": json.dumps(keys),
    }
    if resume is not None:
        meta["resume"] = resume.to_json()
    if process_points:
        meta["resume_processes"] = "[" + ",".join(process_points) + "]"  # each one a point's JSON object
    return meta


def make_snapshot(arrays: dict[str, np.ndarray], metadata: Mapping[str, str]) -> Snapshot:
    """A :class:`Snapshot` whose ``write`` streams ``arrays`` (pool buffers) as safetensors."""
    nbytes = sum(int(a.nbytes) for a in arrays.values())
    # write_tensor_file(file, arrays, header), in the writer thread or the persist process
    portable = PortableWrite(WRITE_TENSORS, {"arrays": arrays, "metadata": dict(metadata)})
    return Snapshot(write=portable.run, nbytes=nbytes, portable=portable)


def read_checkpoint_bytes(
    data: bytes | memoryview | np.ndarray, path: str, copy: bool = True
) -> tuple[dict[str, np.ndarray], CheckpointInfo]:
    """Parse one checkpoint file's bytes into arrays (copies, or with ``copy=False`` views
    into ``data``) and :class:`CheckpointInfo`."""
    arrays, meta = read_tensor_file(data, copy=copy)
    keys = tuple(json.loads(meta["variables"])) if "variables" in meta else tuple(arrays)
    epoch = _opt_int(meta.get("epoch"))
    info = CheckpointInfo(
        path=path,
        step=int(meta.get("step", 0)),
        epoch=epoch,
        batch=_opt_int(meta.get("batch")),
        next_epoch=int(meta.get("next_epoch", epoch or 0)),
        backend=meta.get("backend"),
        keras_version=meta.get("keras_version"),
        keys=keys,
        resume=_resume_point(meta.get("resume"), path),
        process_points=_process_points(meta.get("resume_processes"), path),
    )
    return arrays, info


def _resume_point(text: str | None, path: str) -> ResumePoint | None:
    if not text:
        return None
    try:
        return ResumePoint.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        warnings.warn(
            f"autockpt: {path} has an unreadable resume position ({exc}); resuming at the start of its epoch",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _process_points(text: str | None, path: str) -> tuple[ResumePoint, ...]:
    if not text:
        return ()
    points = tuple(_resume_point(json.dumps(item), path) for item in json.loads(text))
    return () if any(p is None for p in points) else points  # type: ignore[return-value]


def _opt_int(text: str | None) -> int | None:
    if text is None or text == "-1":
        return None
    return int(text)


def read_local_file(path: str) -> tuple[dict[str, np.ndarray], CheckpointInfo]:
    """Read a checkpoint file through a copy-on-write memory map: the arrays are writable views
    of the mapped file (no copy; changes stay in this process), and keep the mapping alive."""
    data = map_file(path)
    if not len(data):
        raise ValueError(f"{path} is empty")
    return read_checkpoint_bytes(data, path, copy=False)


def read_record(
    storage: Storage, record: CheckpointRecord, verified: np.ndarray | None = None
) -> tuple[dict[str, np.ndarray], CheckpointInfo]:
    """Read the checkpoint a manifest record names; ``verified``: its bytes, already read and
    verified (``ReadWhileVerifying.take``): the arrays are then views into them."""
    if verified is not None:
        return read_checkpoint_bytes(verified, location_of(storage, record.name), copy=False)
    path = storage.local_path(record.name)
    if path is not None:
        return read_local_file(path)
    with storage.open_read(record.name) as f:
        data = f.read()
    return read_checkpoint_bytes(data, location_of(storage, record.name))


def latest_record(
    dirpath: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[Storage, CheckpointRecord | None]:
    """The storage for ``dirpath`` (a URL with fsspec ``storage_options``) and its newest
    Keras checkpoint that verifies (or None)."""
    storage = storage_for(dirpath, storage_options)
    return storage, find_latest_valid(storage, framework=FRAMEWORK)


def latest_checkpoint(
    dirpath: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> str | None:
    """Path (or URL) of the newest valid Keras checkpoint in ``dirpath``, or None.

    "Valid" means listed in the manifest with a matching size and checksum; a corrupt newest
    file is skipped with a warning and the previous one is returned. ``storage_options``: as
    the callback's, for a URL ``dirpath``.
    """
    storage, record = latest_record(dirpath, storage_options)
    if record is None:
        return None
    return location_of(storage, record.name)


def load_checkpoint(
    source: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[dict[str, np.ndarray], CheckpointInfo]:
    """Arrays and info of a checkpoint file, or of the newest valid one in a directory (or
    under a URL, with fsspec ``storage_options``). The arrays of a local file are writable
    views of the file mapped copy-on-write (no copy; see :func:`read_local_file`).

    Raises ``FileNotFoundError`` when ``source`` is a directory without a Keras checkpoint.
    """
    text = os.fspath(source)
    if os.path.isfile(text):
        return read_local_file(text)
    storage, record = latest_record(text, storage_options)
    if record is None:
        raise FileNotFoundError(
            f"no valid autockpt Keras checkpoint in {text!r}. Fix: pass the dirpath an "
            "AutoCheckpoint callback wrote to, or the path of a .safetensors checkpoint file."
        )
    return read_record(storage, record)
