"""A resume's one pass over a Lightning checkpoint file: loaded while its CRC-32 is checked.

Auto-resume verifies the newest checkpoint against its manifest record before anything is
restored from it (a torn or corrupt file is passed over for an older one). Verifying and then
letting Lightning read the file read it twice, one after the other. :class:`LoadWhileVerifying`
is the ``check`` that ``resume_record`` runs on each candidate: a helper thread computes the
file's CRC-32 (:func:`~autockpt_core.persist.verify`: its reads and ``zlib.crc32``
release the GIL) while the training thread loads the file the way Lightning would
(``strategy.load_checkpoint``: the trainer's ``checkpoint_io``, map location and weights-only
setting). Nothing is restored from what was loaded until the CRC matched; :func:`serving` then
hands it to Lightning's own restore in place of a second read.

Only where that load is :class:`~lightning.pytorch.strategies.Strategy`'s own (single device,
DDP: no collective inside it, so global rank 0 may run it alone while it picks) and the
candidate is one file (:func:`fusable`). A candidate under a URL (object storage) is downloaded
once by ``fetches`` (:class:`~autockpt_core.persist.verified_fetch.FetchWhileVerifying`: the
CRC-32 is computed on the way) and then loaded from its local copy. A final checkpoint that the
resume passes over for an earlier one (``skip``) is only verified.

Call order (training thread, global rank 0): ``session.resume_record(check=loads.check)``,
then ``loads.take(record)`` for the record it returned (None when it was not loaded here: the
other ranks, a mirror-only record copied into ``dirpath``, a skipped one), then
``with serving(strategy, path, loaded): connector._restore_modules_and_callbacks(path)``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

import lightning.pytorch as pl
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.migration import pl_legacy_patch

from autockpt_core.persist import CheckpointRecord, Storage, local_size_problem, verify
from autockpt_core.persist.verified_fetch import FetchWhileVerifying


def fusable(trainer: pl.Trainer, sharded: bool) -> bool:
    """Whether rank 0 may load candidates while it picks: the strategy's load is the base one
    (a strategy that overrides it may run collectives inside, e.g. FSDP's broadcast) and the
    checkpoint is one file."""
    return not sharded and type(trainer.strategy).load_checkpoint is Strategy.load_checkpoint


class Loaded:
    """What loading one candidate gave: the checkpoint dict, or the error the load raised (an
    intact file the load refuses, e.g. weights-only; raised where Lightning would raise it)."""

    def __init__(self, name: str, checkpoint: dict[str, Any] | None, error: BaseException | None) -> None:
        self.name = name
        self.checkpoint = checkpoint
        self.error = error

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        assert self.checkpoint is not None
        return self.checkpoint


class LoadWhileVerifying:
    """A ``check`` for ``resume_record`` that loads each single-file candidate while verifying
    it and keeps what the one that verified gave (see the module docstring).

    ``weights_only``: as the restore passes it to Lightning. ``skip(record)``: True for a
    record to verify only (not to be loaded). ``fetches``: downloads candidates under a URL
    (without it they are only verified).
    """

    def __init__(
        self,
        strategy: Strategy,
        storage: Storage,
        weights_only: bool,
        skip: Callable[[CheckpointRecord], bool] = lambda record: False,
        fetches: FetchWhileVerifying | None = None,
    ) -> None:
        self.strategy = strategy
        self.storage = storage
        self.weights_only = weights_only
        self.skip = skip
        self.fetches = fetches
        self._kept: Loaded | None = None

    def check(self, record: CheckpointRecord) -> str | None:
        """None when ``record``'s file matches its size and checksum (what loading it gave is
        then kept for :meth:`take`), else why not."""
        self._kept = None  # at most one candidate's state in memory
        if record.files is not None or record.algorithm != "crc32" or self.skip(record):
            return verify(self.storage, record)
        path = self.storage.local_path(record.name)
        if path is None:
            return self._fetch_then_load(record)
        if (found := local_size_problem(path, record)) is not None:
            return found
        problem: list[str | None] = []
        failed: list[BaseException] = []

        def run_verify() -> None:
            try:
                problem.append(verify(self.storage, record))
            except BaseException as exc:  # re-raised on the training thread below
                failed.append(exc)

        verifier = threading.Thread(target=run_verify, name="autockpt-verify", daemon=True)
        verifier.start()
        try:
            checkpoint, error = self._load(path)
        finally:
            verifier.join()
        if failed:
            raise failed[0]
        if problem[0] is not None:
            return problem[0]
        self._kept = Loaded(record.name, checkpoint, error)
        return None

    def _fetch_then_load(self, record: CheckpointRecord) -> str | None:
        if self.fetches is None:
            return verify(self.storage, record)
        problem = self.fetches.check(record)
        path = self.fetches.kept_path(record)
        if problem is not None or path is None:
            return problem
        self._kept = Loaded(record.name, *self._load(path))
        return None

    def _load(self, path: str) -> tuple[dict[str, Any] | None, BaseException | None]:
        try:
            with pl_legacy_patch():
                return self.strategy.load_checkpoint(path, weights_only=self.weights_only), None
        except Exception as exc:  # an intact file may still be refused; a corrupt one fails here too
            return None, exc

    def take(self, record: CheckpointRecord) -> Loaded | None:
        """What loading ``record`` gave, once; None when it was not loaded here."""
        kept, self._kept = self._kept, None
        if kept is None or kept.name != record.name:
            return None
        return kept


@contextlib.contextmanager
def serving(strategy: Strategy, path: str, loaded: Loaded | None) -> Iterator[None]:
    """Within the block, ``strategy.load_checkpoint(path)`` returns (or raises) what ``loaded``
    holds, once, instead of reading the file again; any other call goes to the strategy."""
    if loaded is None:
        yield
        return
    original = strategy.load_checkpoint
    shadowed = "load_checkpoint" in vars(strategy)
    pending: list[Loaded] = [loaded]

    def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if pending and os.fspath(checkpoint_path) == path:
            return pending.pop().result()
        return original(checkpoint_path, *args, **kwargs)

    strategy.load_checkpoint = load_checkpoint  # type: ignore[method-assign]
    try:
        yield
    finally:
        pending.clear()
        if shadowed:
            strategy.load_checkpoint = original  # type: ignore[method-assign]
        else:
            del strategy.load_checkpoint
