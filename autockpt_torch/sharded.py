"""One rank's part of a sharded checkpoint: ``torch.distributed.checkpoint.async_save`` of its
shards into a directory every rank shares, staged into host buffers that are reused from one
checkpoint to the next.

Call order (training thread, every rank, together):

- ``ShardedWriter()`` once per fit (a collective: it creates the gloo group the background
  saves coordinate over, so they never interleave with training's collectives on the
  default group);
- ``save(state, directory)`` at a checkpoint: waits for this rank's previous save, then
  stages ``state`` (a copy into the stager's cached buffers: pinned on CUDA; on a background
  thread) and writes its shards and, on the coordinator, DCP's ``.metadata`` in a background
  thread (fsync'ed, ``FileSystemWriter(sync_files=True)``), then checksums them into its
  listing (:data:`LISTING`). The coordinator's save completes only after every rank's files
  and listing are written: DCP gathers every rank's write results before it writes
  ``.metadata``;
- ``wait_staged()`` before the next optimizer step (the staging copy reads the live tensors);
- ``wait_written()`` before anything that needs the files (raises the save's error here);
- ``close()`` at the end of the fit (waits, then frees the staging buffers and destroys the
  group it created).

Where torch has no ``DefaultStager`` (older releases), or its ``DefaultStager`` cannot stage
twice (torch 2.11 closes it at the end of every stage, so the next save fails with
``KeyError: <class 'type'>``; :func:`stager_survives_reuse` finds out once per process), the
save stages synchronously through DCP's own default, with no reuse of buffers, and one warning
says why. A save whose staging fails anyway is staged again that way at ``wait_staged()``
(staging reads the live tensors, which do not change before it returns; every rank fails the
same way when the cause is its torch, and a failed staging enters no collective), with the
same warning, and the stager is not used again.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from autockpt_core import CheckpointWriteError
from autockpt_core.persist.checksum import checksum_stream


@functools.lru_cache(maxsize=None)
def stager_survives_reuse() -> bool:
    """Whether this torch's ``DefaultStager`` stages a state twice (a probe of a few
    microseconds on a one-element tensor, run once per process). False on torch 2.11, whose
    ``DefaultStager._stage`` closes its ``StateDictStager`` after each stage: that clears its
    copier table and its cached storages, and the next stage raises ``KeyError``."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    probe = DefaultStager(StagingOptions(False, False, False, False))
    try:
        for _ in range(2):
            probe.stage({"tensor": torch.zeros(1), "nested": {"list": [1]}})
    except Exception:  # noqa: BLE001 - any failure means: do not reuse it
        return False
    finally:
        probe.close()
    return True


def _warn_synchronous_staging(why: str) -> None:
    warnings.warn(
        f"autockpt: sharded checkpoints stage synchronously through DCP's default stager (the "
        f"training waits for each copy; no staging buffers are reused): {why}. torch 2.13 and "
        f"later reuse DCP's DefaultStager.",
        RuntimeWarning,
        stacklevel=3,
    )


def _reusing_stager() -> Any | None:
    """DCP's ``DefaultStager``, caching its staging storages between saves (None where absent or
    where it cannot stage twice: then one warning)."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # pragma: no cover - older torch
        return None
    if not stager_survives_reuse():
        _warn_synchronous_staging(f"torch {torch.__version__}'s DefaultStager cannot stage a second time")
        return None
    cuda = torch.cuda.is_available()
    # pinned memory and non-blocking copies need CUDA; shared memory is for a saver process
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
        )
    )


def _plain_errors(future: Future[Any], directory: Path) -> Future[Any]:
    """``future``, with DCP's ``CheckpointException`` (a ``BaseException``, which ``except
    Exception`` would let through) turned into a :class:`CheckpointWriteError` naming each
    failed rank's error."""
    out: Future[Any] = Future()

    def settle(done: Future[Any]) -> None:
        try:
            out.set_result(done.result())
        except CheckpointException as exc:
            failed = {rank: e[0] if isinstance(e, tuple) else e for rank, e in exc.failures.items()}  # (error, frames)
            failures = "; ".join(f"rank {rank}: {type(e).__name__}: {e}" for rank, e in sorted(failed.items()))
            error = CheckpointWriteError(f"the sharded checkpoint in {directory} was not written: {failures}")
            error.__cause__ = exc
            out.set_exception(error)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            out.set_exception(exc)

    future.add_done_callback(settle)
    return out


LISTING = ".autockpt-files-rank{rank}.json"
"""Each rank's listing of the files it wrote into a checkpoint directory: name -> [size, CRC-32]."""


class _ListingFileSystemWriter(dcp.FileSystemWriter):
    """DCP's ``FileSystemWriter`` that, once this rank's files are written and fsync'ed (in
    ``write_data``, DCP's background thread), checksums them (reading them back while they
    are still in the page cache) and writes their sizes and CRC-32 to this rank's
    :data:`LISTING`, fsync'ed. DCP's coordinator writes ``.metadata`` only after every rank's
    ``write_data`` returned, so once its save completes every rank's listing is in place: the
    commit then checksums only the files no listing covers (:func:`read_listings`) instead of
    reading every rank's files on one rank."""

    def __init__(self, path: Path, rank: int, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._directory = Path(path)
        self._rank = rank

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)  # completed: FileSystemWriter writes synchronously
        names = sorted({result.storage_data.relative_path for result in future.wait()})
        files: dict[str, list[Any]] = {}
        for name in names:
            with open(self._directory / name, "rb") as f:
                digest, size = checksum_stream(f)
            files[name] = [size, digest]
        listing = self._directory / LISTING.format(rank=self._rank)
        with open(listing, "w") as f:
            json.dump(files, f)
            f.flush()
            os.fsync(f.fileno())
        return future


def read_listings(directory: Path) -> dict[str, list[Any]]:
    """Every rank's :data:`LISTING` in ``directory``, merged: file name -> [size, CRC-32]."""
    files: dict[str, list[Any]] = {}
    for listing in sorted(directory.glob(LISTING.format(rank="*"))):
        files.update(json.loads(listing.read_text()))
    return files


class _KeptStaging:
    """The stager handed to ``dcp.async_save``: delegates to ``stager`` and keeps the future of
    its newest stage. DCP's ``staging_completion`` reports a stage that failed before
    ``async_save`` returned as a success (torch 2.11-2.13), so the writer reads this one."""

    def __init__(self, stager: Any) -> None:
        self.stager = stager
        self.staging: Future[Any] | None = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return bool(getattr(self.stager, "should_synchronize_after_execute", False))

    def stage(self, state_dict: Any) -> Any:
        staged = self.stager.stage(state_dict)
        self.staging = staged if isinstance(staged, Future) else None
        return staged

    def synchronize_staging(self) -> None:
        self.stager.synchronize_staging()

    def close(self) -> None:
        self.stager.close()


class ShardedWriter:
    """See the module docstring. ``group``: the process group the saves coordinate over
    (default: a new gloo group of every rank; creating it is a collective)."""

    def __init__(self, group: Any | None = None) -> None:
        self._owns_group = group is None
        self._group = group if group is not None else dist.new_group(backend="gloo")
        stager = _reusing_stager()
        self._stager = _KeptStaging(stager) if stager is not None else None
        self._staged: Future[Any] | None = None
        self._written: Future[Any] | None = None
        self._saving: tuple[dict[str, Any], Path] | None = None  # until staged: a failed staging redoes it

    @property
    def reuses_buffers(self) -> bool:
        """Whether staging buffers are kept between saves (torch's ``DefaultStager``)."""
        return self._stager is not None

    def save(self, state: dict[str, Any], directory: Path) -> Future[Any]:
        """Start this rank's save of ``state`` into ``directory`` (all ranks, same directory).

        Returns the future of the write (on the coordinator, rank 0 of the group, it completes
        once every rank's files and ``.metadata`` are written).
        """
        self.wait_written()
        self._saving = (state, directory) if self._stager is not None else None
        return self._start(state, directory)

    def _start(self, state: dict[str, Any], directory: Path) -> Future[Any]:
        rank = dist.get_rank() if dist.is_initialized() else 0
        writer = _ListingFileSystemWriter(directory, rank, single_file_per_rank=True, sync_files=True)
        kwargs: dict[str, Any] = {"storage_writer": writer, "process_group": self._group}
        if self._stager is not None:
            kwargs["async_stager"] = self._stager
        response = dcp.async_save(state, **kwargs)
        staged = getattr(response, "staging_completion", None)
        if self._stager is not None and self._stager.staging is not None:
            staged = self._stager.staging
        self._staged = staged
        written = _plain_errors(getattr(response, "upload_completion", response), directory)
        self._written = written
        return written

    def wait_staged(self) -> None:
        """Block until the staging copy of the newest save is done (before tensors change).

        A staging that failed is done again through DCP's own staging (see the module
        docstring); its write is then the one ``wait_written`` waits for."""
        staged, self._staged = self._staged, None
        saving, self._saving = self._saving, None
        if staged is None:
            return
        try:
            staged.result()
        except Exception as exc:  # noqa: BLE001 - the stager's own failure: staged again without it
            if saving is None or self._stager is None:
                raise
            self._stager.close()
            self._stager = None
            _warn_synchronous_staging(f"DCP's DefaultStager failed to stage this checkpoint ({type(exc).__name__}: {exc})")
            self._start(*saving)

    def wait_written(self, timeout: float | None = None) -> None:
        """Block until this rank's newest save is written; raise its error (once): a
        :class:`~autockpt_core.CheckpointWriteError` naming every failed rank's error."""
        self.wait_staged()
        written = self._written
        if written is None:
            return
        try:
            written.result(timeout)
        finally:
            if written.done():
                self._written = None

    @property
    def in_flight(self) -> bool:
        return self._written is not None and not self._written.done()

    def close(self, timeout: float | None = None) -> None:
        """Wait for the newest save (raising its error; ``concurrent.futures.TimeoutError``
        after ``timeout`` seconds), then free the staging buffers."""
        try:
            self.wait_written(timeout)
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self._owns_group and self._group is not None and not self.in_flight and dist.is_initialized():
                dist.destroy_process_group(self._group)  # no save in flight uses it any more
                self._group = None
