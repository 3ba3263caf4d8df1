"""``ResumableSampler``: a shuffling sampler that a resumed run continues mid-epoch.

A plain ``DataLoader(shuffle=True)`` draws each epoch's permutation from the global torch
generator and keeps no position, so a run resumed mid-epoch starts the epoch over with a new
order: some samples are seen twice, others never. This sampler fixes both:

- the order of epoch ``e`` is a permutation seeded by ``(seed, e)`` only, so any process
  reproduces it without drawing from (or disturbing) the global generators;
- its state records the epoch and the number of samples *consumed by training* in it; after
  ``load_state_dict`` the next iteration of that epoch skips exactly those samples.

"Consumed by training" matters because a ``DataLoader`` pulls indices ahead of training
(worker prefetch). ``state_dict(consumed=n)`` takes the count from the caller, who knows how
many batches the training loop finished; without it the sampler falls back to the number of
indices it handed out in this epoch (exact only for a loader with ``num_workers=0``, no
prefetch). The Lightning callback passes the count (batches finished in the epoch × batch
size) and saves the state in its own checkpoint entry.

Usage::

    sampler = ResumableSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

Epochs: the loop calls ``set_epoch(e)`` before each epoch (Lightning does it for every
training sampler that has ``set_epoch``); a loop that does not call it gets the next epoch on
every new iteration.

Threading: used from the thread that iterates the loader (the training thread); workers only
receive indices.
"""

from __future__ import annotations

from typing import Any, Iterator, Sized

import torch
from torch.utils.data import Sampler

__all__ = ["ResumableSampler"]

_STATE_VERSION = 1


class ResumableSampler(Sampler[int]):
    """Indices ``0 .. n-1`` in a per-epoch order, resumable mid-epoch (see the module docstring).

    Args:
        data_source: the dataset (anything with ``len``) or the number of samples.
        shuffle: a new permutation each epoch (True) or ``0 .. n-1`` in order (False).
        seed: the permutation of epoch ``e`` depends on ``seed`` and ``e`` only.
    """

    def __init__(self, data_source: Sized | int, *, shuffle: bool = True, seed: int = 0) -> None:
        size = data_source if isinstance(data_source, int) else len(data_source)
        if size < 0:
            raise ValueError(f"ResumableSampler needs a non-negative number of samples, got {size}")
        self.size = int(size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0  # indices handed out in the current epoch (including any skipped on resume)
        self.iterations_started = 0
        self._epoch_set = False  # set_epoch() called since the last iteration started
        self._resume_at: tuple[int, int] | None = None  # (epoch, samples to skip)

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def order(self, epoch: int) -> list[int]:
        """All indices of ``epoch`` in the order this sampler yields them."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(_mix(self.seed, epoch))
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        if self.iterations_started > 0 and not self._epoch_set:
            self.epoch += 1  # nobody calls set_epoch: every new iteration is the next epoch
        self._epoch_set = False
        self.iterations_started += 1
        epoch = self.epoch
        start = 0
        if self._resume_at is not None:
            resume_epoch, skip = self._resume_at
            self._resume_at = None
            if resume_epoch == epoch:
                start = skip
        self.position = start
        return self._yield_from(self.order(epoch)[start:])

    def _yield_from(self, indices: list[int]) -> Iterator[int]:
        for index in indices:
            self.position += 1
            yield index

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Epoch and position to resume from; ``consumed`` = samples training finished this epoch."""
        position = self.position if consumed is None else int(consumed)
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "consumed": max(0, min(position, self.size)),
            "size": self.size,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration of its epoch skips the consumed samples.

        A finished epoch resumes at the start of the next one. Raises ``ValueError`` when the
        state belongs to a sampler over another dataset size, order or seed (the positions
        would then mean different samples).
        """
        mismatched = [k for k in ("size", "shuffle", "seed") if state.get(k) != getattr(self, k)]
        if mismatched:
            raise ValueError(
                "ResumableSampler state does not match this sampler ("
                + ", ".join(f"{k}: saved {state.get(k)!r}, now {getattr(self, k)!r}" for k in mismatched)
                + "); build the sampler with the same dataset, shuffle and seed as the run that saved it"
            )
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if consumed >= self.size:
            epoch, consumed = epoch + 1, 0
        self.epoch = epoch
        self._epoch_set = True
        self.position = consumed
        self._resume_at = (epoch, consumed)


def _mix(seed: int, epoch: int) -> int:
    """A 63-bit seed from (seed, epoch); neighbouring epochs get unrelated permutations."""
    value = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    value ^= value >> 31
    value = (value * 0xD6E8FEB86659FD93) & (2**64 - 1)
    value ^= value >> 32
    return value & (2**63 - 1)
