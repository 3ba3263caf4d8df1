"""The callback's save path for a sharded model (Lightning's ``ModelParallelStrategy``, FSDP2
``fully_shard`` and tensor parallelism): every rank writes its own shards, one manifest record
commits them all.

A checkpoint is a directory ``ckpt-step<N>.ckpt/`` laid out as Lightning's own
``ModelParallelStrategy.save_checkpoint`` lays it out (``trainer.fit(ckpt_path=...)`` and
Lightning's loader take it): ``torch.distributed.checkpoint`` files (one ``__<rank>_0.distcp``
per rank and ``.metadata``) holding ``state_dict`` and ``optimizer_<i>``, and ``meta.pt``
(``torch.save`` of everything else: loops, callbacks, this callback's RNG of every rank).

Call order (training thread, every rank, together), from :class:`AutoCheckpoint`:

- ``check_sharded_config(config, storage)`` in ``setup("fit")``;
- ``ShardedSave()`` in ``on_fit_start`` (a collective: the gloo group the background
  saves use);
- ``checkpoint(...)`` at every checkpoint: the previous checkpoint must be written on every
  rank and committed on rank 0 (its error is raised on every rank), rank 0 creates a staging
  directory and broadcasts its path, every rank runs ``dump_checkpoint`` and starts its
  asynchronous save (:class:`~autockpt_torch.sharded.ShardedWriter`); rank 0 hands the
  session a snapshot whose ``file_set`` the writer thread completes: it waits until DCP's
  coordinator has every rank's results (so every shard is written and fsync'ed, and each
  rank's listing of its files' checksums is in place), writes ``meta.pt``, checksums the files
  no listing covers and renames the directory into place; then the manifest record is
  committed, and only then does retention delete older checkpoints;
- ``before_update()`` before every optimizer step: the staging copy of this rank's shards must
  be done before the tensors change;
- ``close()`` when the fit ends: this rank's last save written (error raised).
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from autockpt_core import CheckpointSession, Config, ConfigError, Snapshot, Storage
from autockpt_core.config import path_of_location
from autockpt_core.persist import LocalStorage
from autockpt_core.persist.file_set import Checksums, FileSetWrite
from autockpt_core.persist.tree import iter_leaves
from autockpt_torch.host_buffers import tensor_nbytes

if TYPE_CHECKING:  # imported where a sharded fit needs it: torch.distributed.checkpoint takes ~50 ms to import
    from autockpt_torch.sharded import ShardedWriter

from . import internals
from .distributed import raise_if_any_failed

MODE = "sharded"
"""The snapshot mode the summary reports for these checkpoints."""


def is_sharded(trainer: pl.Trainer) -> bool:
    """Whether this fit's checkpoints are sharded (written by every rank)."""
    return isinstance(trainer.strategy, ModelParallelStrategy)


def check_sharded_config(config: Config, storage: Storage | None) -> None:
    """Refuse settings sharded checkpoints cannot serve yet (``setup``, before anything is written).

    Every rank writes into a directory that is renamed into place when complete: ``dirpath``
    must be a local (or network-mounted) directory that every rank sees, and ``mirror`` is not
    supported for them yet.
    """
    local = isinstance(storage, LocalStorage) if storage is not None else path_of_location(str(config.dirpath)) is not None
    if not local:
        raise ConfigError(
            "dirpath",
            str(config.dirpath),
            "sharded checkpoints (ModelParallelStrategy) are written by every rank into one directory, "
            "and autockpt writes them to a local or network-mounted filesystem only",
            "use a directory every rank can write (a shared filesystem for several machines)",
        )
    if config.mirror is not None:
        raise ConfigError(
            "mirror",
            config.mirror,
            "autockpt does not copy sharded checkpoints (ModelParallelStrategy) to a mirror yet",
            "leave mirror unset and put dirpath on a shared filesystem",
        )


def split_checkpoint(checkpoint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what DCP writes, what ``meta.pt`` holds), as ``ModelParallelStrategy.save_checkpoint`` splits it."""
    rest = dict(checkpoint)
    tensors = {"state_dict": rest.pop("state_dict")}
    tensors.update({f"optimizer_{i}": state for i, state in enumerate(rest.pop("optimizer_states", []))})
    return tensors, rest


def local_bytes(tree: Any) -> int:
    """Bytes of the tensors in ``tree`` that this rank holds (a DTensor's local shard)."""
    tensors = iter_leaves(tree, lambda v: isinstance(v, torch.Tensor))
    return sum(tensor_nbytes(t.to_local() if hasattr(t, "to_local") else t) for _, t in tensors)


class _Staging:
    """The session's :class:`~autockpt_core.session.PendingCopy`: DCP's staging copy."""

    def __init__(self, writer: ShardedWriter) -> None:
        self._writer = writer

    def before_update(self) -> None:
        self._writer.wait_staged()

    def wait(self) -> None:
        pass  # the writer thread waits for the save itself (the file set's fill)


def _unused_write(file: IO[bytes]) -> None:  # pragma: no cover - a file set is never written as one file
    raise AssertionError("a sharded checkpoint is committed as a file set")


class ShardedSave:
    """See the module docstring. One per fit and rank."""

    def __init__(self) -> None:
        from autockpt_torch.sharded import ShardedWriter

        self.writer = ShardedWriter()

    def checkpoint(
        self,
        trainer: pl.Trainer,
        session: CheckpointSession | None,
        step: int,
        epoch: int,
        reason: str,
        meta: dict[str, Any] | None,
    ) -> tuple[float, int] | None:
        """Take the checkpoint of ``step`` (trained in ``epoch``) on every rank; rank 0 returns
        (stall, bytes), others None."""
        error: BaseException | None = None
        staging: Path | None = None
        try:
            self.writer.wait_written()  # this rank's previous shards
            if session is not None:
                staging = session.staging_directory()  # the previous checkpoint committed first
        except Exception as exc:
            error = exc
        raise_if_any_failed(trainer, error)  # no rank starts a save the others will not join
        path = Path(trainer.strategy.broadcast(str(staging) if staging is not None else None, src=0))
        if session is None:
            self.writer.save(self._dump(trainer)[0], path)
            return None
        nbytes, started = 0, False

        def snapshot(buffers: Any) -> Snapshot:
            nonlocal nbytes, started
            tensors, metadata = self._dump(trainer)
            written = self.writer.save(tensors, path)
            started = True
            nbytes = local_bytes(tensors)

            def fill(directory: Path) -> Checksums:
                written.result()  # every rank's shards, listings and DCP's .metadata are written and fsync'ed
                with open(directory / internals.metadata_filename(), "xb") as f:
                    f.write(metadata.getbuffer())
                    f.flush()
                    os.fsync(f.fileno())
                from autockpt_torch.sharded import read_listings

                return read_listings(directory)  # each rank checksummed its own files

            return Snapshot(
                write=_unused_write,
                nbytes=nbytes,
                pending=_Staging(self.writer),
                mode=MODE,
                file_set=FileSetWrite(path, fill),
            )

        try:
            stall = session.save(step, epoch, snapshot, meta=meta, reason=reason)
        except BaseException:
            if not started:  # no rank started a save into it (see _dump)
                shutil.rmtree(path, ignore_errors=True)
            raise
        return stall, nbytes

    @staticmethod
    def _dump(trainer: pl.Trainer) -> tuple[dict[str, Any], io.BytesIO]:
        """``dump_checkpoint`` on every rank: (what DCP writes, ``meta.pt``'s bytes on rank 0).

        A failure on any rank is raised on every rank before any rank starts its save: a save
        one rank never joins would hold the others' background threads in DCP's collectives
        until the group's timeout.
        """
        error: BaseException | None = None
        tensors: dict[str, Any] = {}
        metadata = io.BytesIO()
        try:
            tensors, rest = split_checkpoint(internals.checkpoint_connector(trainer).dump_checkpoint(weights_only=False))
            if trainer.is_global_zero:
                torch.save(rest, metadata)  # small (no model or optimizer tensors); the dict is live
        except Exception as exc:
            error = exc
        raise_if_any_failed(trainer, error)
        return tensors, metadata

    def before_update(self) -> None:
        """Before an optimizer step (every rank): the staging copy of the newest save is done."""
        self.writer.wait_staged()

    def close(self, timeout: float | None = None) -> None:
        """This rank's last save written (its error raised; ``concurrent.futures.TimeoutError``
        after ``timeout`` seconds); the staging buffers freed."""
        self.writer.close(timeout)
