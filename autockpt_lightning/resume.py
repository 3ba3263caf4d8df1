"""Exact-resume helpers for :class:`~autockpt_lightning.AutoCheckpoint`: RNG per rank,
``ResumableSampler`` positions, and the checks that say when a resume cannot be exact.

What Lightning 2.6 restores by itself from a checkpoint: weights, optimizer and scheduler
state, loop progress, and the state of a *stateful* train loader (one with
``state_dict``/``load_state_dict``, e.g. torchdata's ``StatefulDataLoader``). What it does not:
the global random generators, and the position of a plain ``DataLoader``. This module fills
those gaps; the callback stores the result under its own key in the checkpoint's
``callbacks`` entry.

Call order (training thread, every rank):

- ``gather_rng(trainer)`` in the callback's save, on all ranks together (one all-gather under
  DDP), right before ``dump_checkpoint``; ``callback_state(...)`` inside ``dump_checkpoint``
  (the callback's ``state_dict``).
- ``restore(trainer, state)`` in ``on_train_start``: samplers first (re-creating the train
  iterator when a worker already pulled indices from a sampler), then the generators last, so
  nothing between the restore and the first training batch draws from them.
- ``loader_problems(trainer)`` in ``on_train_start``: reasons a mid-epoch resume would not be
  exact (the callback warns once).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

from autockpt_torch import ResumableSampler
from autockpt_torch import rng as torch_rng

from . import internals

STATE_VERSION = 1

# Lightning's own warning for a mid-epoch resume with a loader that is not `_Stateful`; a
# plain DataLoader whose sampler is a ResumableSampler does resume exactly.
LIGHTNING_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The train dataloaders of the running fit (empty before ``setup_data``)."""
    combined = internals.combined_loader(trainer)
    return list(combined.flattened) if combined is not None else []


def is_stateful(loader: Any) -> bool:
    """Lightning saves and restores this loader's position itself (``_Stateful``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def samplers_of(loader: Any) -> tuple[Any, Any]:
    """Where a loader's sampler can be: its ``sampler``, and its ``batch_sampler``'s (None if absent)."""
    return getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)


def resumable_sampler(loader: Any) -> ResumableSampler | None:
    """The loader's ResumableSampler (as ``sampler`` or inside its ``batch_sampler``), if any."""
    for candidate in samplers_of(loader):
        if isinstance(candidate, ResumableSampler):
            return candidate
    return None


def sampler_covers_plain_loaders(trainer: pl.Trainer) -> bool:
    """Some train loader is plain, and every plain one resumes through a ResumableSampler."""
    plain = [dl for dl in train_loaders(trainer) if not is_stateful(dl)]
    return bool(plain) and all(resumable_sampler(dl) is not None for dl in plain)


def _batch_size(loader: Any) -> int | None:
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


def loader_problems(trainer: pl.Trainer) -> list[str]:
    """Why resuming this fit mid-epoch would not be exact (one sentence each; empty: it would be)."""
    problems: list[str] = []
    unsized = trainer.num_training_batches == float("inf")
    for index, loader in enumerate(train_loaders(trainer)):
        name = f"train dataloader {index} ({type(loader).__name__})"
        sampler = resumable_sampler(loader)
        if is_stateful(loader):
            wrapped = random_sampler_wrapped_for_ranks(loader) if trainer.world_size > 1 else None
            if wrapped is not None:
                problems.append(
                    f"{name} shuffles with a {wrapped}, which Lightning wraps in a DistributedSamplerWrapper "
                    f"for {trainer.world_size} processes: each rank draws the epoch's order from its global "
                    "generator when the epoch's iterator is created, and after a mid-epoch resume that "
                    "happens before the generators are restored, so the rest of the epoch comes in another "
                    "order. Fix: pass sampler=torchdata.stateful_dataloader.sampler.StatefulDistributedSampler("
                    "dataset, shuffle=True, seed=0) instead of shuffle=True (a seeded order per epoch, whose "
                    "position the loader saves)"
                )
                continue
            if unsized and _prefetches(trainer) and not can_carry_prefetched(trainer):
                problems.append(
                    f"{name} has no length: Lightning fetches one batch ahead and saves the loader's "
                    "state after that fetch, so each mid-epoch resume skips one batch; autockpt "
                    "carries that batch over only in single-process training. Fix: give the dataset "
                    "a __len__ (a sized loader is not fetched ahead)"
                )
            continue
        if trainer.world_size > 1:
            problems.append(
                f"{name} is not stateful, and under {trainer.world_size} processes Lightning shards it "
                "with a distributed sampler whose position is not saved (a ResumableSampler inside it "
                "included). Fix: use torchdata.stateful_dataloader.StatefulDataLoader"
            )
        elif sampler is not None:
            if _batch_size(loader) is None:
                problems.append(
                    f"{name} has a ResumableSampler but no batch_size, so the samples training consumed "
                    "cannot be counted; the sampler's own count includes worker prefetch"
                )
        else:
            problems.append(
                f"{name} is not resumable: after a mid-epoch resume Lightning restarts its iteration at "
                "the first batch of the epoch (samples seen twice or never, another shuffle order). Fix: "
                "use torchdata.stateful_dataloader.StatefulDataLoader, or pass "
                "sampler=autockpt_lightning.ResumableSampler(dataset, shuffle=True, seed=0) to the DataLoader"
            )
    return problems


def random_sampler_wrapped_for_ranks(loader: Any) -> str | None:
    """The name of the random sampler Lightning wrapped in a ``DistributedSamplerWrapper`` in
    this loader (what DDP makes of ``StatefulDataLoader(shuffle=True)``), or None."""
    for candidate in samplers_of(loader):
        if isinstance(candidate, DistributedSamplerWrapper):
            inner = internals.wrapped_sampler(candidate.dataset)
            if inner is internals.UNKNOWN:
                return f"sampler autockpt cannot see ({internals.INTERNALS['wrapped_sampler'].label} is missing)"
            # torch's RandomSampler and torchdata's (not a subclass of torch's) draw a new order per iteration
            if any(cls.__name__ == "RandomSampler" for cls in type(inner).__mro__):
                return f"{type(inner).__module__}.{type(inner).__name__}"
    return None


def _prefetches(trainer: pl.Trainer) -> bool:
    fetcher = internals.data_fetcher(trainer)
    return getattr(fetcher, "prefetch_batches", 0) > 0


def can_carry_prefetched(trainer: pl.Trainer) -> bool:
    """Whether the batches Lightning fetched ahead can be saved and put back on resume.

    Lightning fetches ahead only from unsized loaders (``_PrefetchDataFetcher``), and a
    stateful loader's saved state already counts those batches as consumed: the resumed run
    would skip them. Single process only (every rank has its own batches; only rank 0 writes).
    """
    fetcher = internals.data_fetcher(trainer)
    return (
        trainer.world_size == 1
        and trainer.num_training_batches == float("inf")
        and isinstance(getattr(fetcher, "batches", None), list)
        and all(is_stateful(dl) for dl in train_loaders(trainer))
    )


def prefetched_batches(trainer: pl.Trainer) -> list[Any] | None:
    """The batches fetched ahead of training (unsized stateful loaders), to save; None if none."""
    if not can_carry_prefetched(trainer) or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
        return None
    batches = list(internals.data_fetcher(trainer).batches)  # can_carry_prefetched: it has them
    return batches or None


def restore_prefetched(trainer: pl.Trainer, batches: list[Any]) -> None:
    """Put saved fetched-ahead batches in front of the resumed fetcher's own (on_train_start)."""
    internals.data_fetcher(trainer).batches[0:0] = list(batches)  # after can_carry_prefetched


def at_clean_boundary(trainer: pl.Trainer) -> bool:
    """Whether a checkpoint taken in this ``on_train_batch_end`` resumes bitwise exactly.

    Not at the last batch of an epoch (the resumed run creates the next epoch's iterator at
    another point, so the generators drift by that draw) and not right before a validation
    run (Lightning skips it on resume, and the draws it would have made are missing). Measured
    on Lightning 2.6 by resuming from every step of a run with dropout, shuffling and
    validation; every other step boundary resumes bitwise exactly. Where this Lightning cannot
    say (an internal missing: warned at the fit's start), the boundary counts as clean.
    """
    if internals.at_epochs_last_batch(trainer):
        return False
    fetcher = internals.data_fetcher(trainer)
    return not (fetcher is not None and internals.validation_next(trainer, fetcher))


def sampler_states(trainer: pl.Trainer) -> list[dict[str, Any] | None]:
    """Per train loader: its ResumableSampler's state at the samples training consumed, or None.

    Stateful loaders are skipped (Lightning saves them). Consumed = batches fetched for
    training in this epoch × batch size (sized loaders are not fetched ahead by Lightning).
    """
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    states: list[dict[str, Any] | None] = []
    for loader in train_loaders(trainer):
        sampler = resumable_sampler(loader)
        if sampler is None or is_stateful(loader):
            states.append(None)
            continue
        batch_size = _batch_size(loader)
        consumed = None if batch_size is None else ready * batch_size
        states.append(sampler.state_dict(consumed=consumed))
    return states


def restore_samplers(trainer: pl.Trainer, states: list[dict[str, Any] | None]) -> bool:
    """Load saved positions into the train loaders' samplers; True when the iterator must be rebuilt.

    A loader with workers pulled indices from its sampler when Lightning created the iterator
    (before ``on_train_start``), so that iterator must be created again to start at the
    restored position.
    """
    rebuild = False
    loaders = train_loaders(trainer)
    for loader, state in zip(loaders, states):
        sampler = resumable_sampler(loader)
        if state is None or sampler is None or is_stateful(loader):
            continue
        started = sampler.iterations_started > 0
        sampler.load_state_dict(state)
        rebuild = rebuild or started
    return rebuild


def rebuild_train_iterator(trainer: pl.Trainer) -> None:
    """Create the train iterator again (as Lightning's ``setup_data`` did), before any batch."""
    fetcher = internals.data_fetcher(trainer)
    if fetcher is not None:
        iter(fetcher)


def gather_rng(trainer: pl.Trainer) -> dict[int, dict[str, Any]]:
    """Every rank's generator states by global rank (a collective under DDP: call on all ranks)."""
    local = torch_rng.capture_rng()
    if trainer.world_size <= 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {trainer.global_rank: local}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (trainer.global_rank, local))
    return {int(rank): state for rank, state in gathered}


def callback_state(trainer: pl.Trainer, rng: dict[int, dict[str, Any]] | None) -> dict[str, Any]:
    """The callback's checkpoint entry: generator states per rank and sampler positions."""
    return {
        "version": STATE_VERSION,
        "world_size": trainer.world_size,
        "rng": rng if rng is not None else {trainer.global_rank: torch_rng.capture_rng()},
        "samplers": sampler_states(trainer),
        "prefetched": prefetched_batches(trainer),
    }


def restore(trainer: pl.Trainer, state: dict[str, Any]) -> list[str]:
    """Apply a :func:`callback_state` entry (``on_train_start``); returns why it is not exact, if so."""
    problems: list[str] = []
    if state.get("version") != STATE_VERSION:
        return [f"its autockpt state has version {state.get('version')!r}, this autockpt reads {STATE_VERSION}"]
    samplers = state.get("samplers") or []
    if samplers and len(samplers) != len(train_loaders(trainer)):
        problems.append(
            f"the checkpoint has {len(samplers)} train loader position(s), this fit has {len(train_loaders(trainer))}"
        )
    try:
        if restore_samplers(trainer, samplers):
            rebuild_train_iterator(trainer)
    except ValueError as exc:
        problems.append(str(exc))
    prefetched = state.get("prefetched")
    if prefetched:
        if can_carry_prefetched(trainer):
            restore_prefetched(trainer, prefetched)
        else:
            problems.append(f"{len(prefetched)} batch(es) fetched ahead before the checkpoint cannot be put back")
    rng = state.get("rng") or {}
    rank = trainer.global_rank
    if rank in rng:
        problems.extend(torch_rng.restore_rng(rng[rank]))  # last: nothing may draw after it
    else:
        problems.append(
            f"the checkpoint holds no generator state for rank {rank} (saved by {state.get('world_size')} process(es))"
        )
    return problems
