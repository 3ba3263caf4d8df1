"""Copy every torch tensor of a nested state into reusable host buffers, and save the copy.

Phase 1 of a checkpoint for torch-based adapters (Lightning, Keras on the torch backend):
``snapshot_tree(state, pool)`` returns a structural copy of ``state`` whose tensors live in
buffers from ``pool`` (allocated once, reused every checkpoint) and whose other leaves are
deep copies, so the result no longer aliases live parameters or optimizer state. It is the
``"sync"`` mode of :class:`autockpt_torch.staging.TorchSnapshotter`, which also overlaps the
copy with the next step.

Phase 2: ``save_tree(tree, file)`` is ``torch.save`` of that copy, written from the buffers.

Threading: call ``snapshot_tree`` on the training thread. The returned tree is then read by
the writer thread (``save_tree``) while training goes on; the caller must not reuse ``pool``
for the next snapshot before that persist finished (``CheckpointSession.save`` waits for it).

CUDA: buffers are pinned when CUDA is available, device tensors are copied with
``non_blocking=True`` on a copy stream and waited for once, so the copies are complete when
the function returns.
"""

from __future__ import annotations

import pickle
from typing import IO, Any

import torch

from autockpt_core import BufferPool

from . import internals
from .host_buffers import torch_buffer_pool
from .staging import TorchSnapshotter

__all__ = ["WRITE_TREE", "save_tree", "snapshot_tree", "torch_buffer_pool", "write_tree"]

WRITE_TREE = "autockpt_torch.snapshot:write_tree"
""":func:`write_tree` by name, for ``PortableWrite``."""


def snapshot_tree(state: Any, pool: BufferPool[torch.Tensor], threads: int | None = 1) -> tuple[Any, int]:
    """Copy ``state`` with every tensor placed in a buffer of ``pool``; returns ``(copy, nbytes)``.

    ``nbytes`` is the tensor payload copied (the dense size for sparse tensors). The caller
    brackets the call with ``pool.begin_round()``/``pool.end_round()``
    (``CheckpointSession.save`` does). Buffers are keyed by the tensor's path in the tree; a
    path seen twice in one call (dict keys that contain "/") gets its own buffer. Dense
    (strided) tensors go into pool buffers; sparse, quantized and other layouts fall back to a
    fresh CPU copy.

    ``threads`` is torch's intra-op thread count during the copies (restored afterwards);
    None keeps the current setting. A host copy is memory-bound, and torch's multi-threaded
    copy stalls when another process holds a core: on the 2-core CI machines under load,
    copying 2.6 MB took 0.2 ms with 1 thread and 5-100 ms with 2 (160 MB: 24 ms vs 13-80 ms).
    Contiguous CPU tensors are copied through numpy (one thread, GIL released) either way.
    """
    copied, total, _pending = TorchSnapshotter("sync", threads=threads).snapshot(state, pool)
    return copied, total


class WriteErrorKeeper:
    """File wrapper that remembers the first exception the underlying ``write`` raised."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            return self._raw.write(data)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def flush(self) -> None:
        self._raw.flush()


def save_tree(tree: Any, file: IO[bytes], *, zip_crc32: bool = True) -> None:
    """``torch.save(tree, file)``, re-raising the file's own write error when there was one.

    When ``file.write`` raises (say ENOSPC), torch.save's zip writer reports a follow-up
    "unexpected pos" RuntimeError instead; the original error says what to fix.

    What torch.save does with the buffers (torch 2.13, checked): each CPU storage goes to
    ``file.write`` as one memoryview of the tensor's memory (no copy), between ~40 small
    writes of zip headers and the pickle per tensor (``HashingWriter(coalesce=...)`` gathers
    those). Its zip writer also computes a CRC-32 of every record: a second pass over all the
    bytes, on top of the whole-file CRC-32 autockpt's storage computes. ``zip_crc32=False``
    skips the zip's own CRC through torch's private ``_save`` with a writer built without it
    (the per-record CRC fields stay 0; ``torch.load`` and Lightning load the file, ``zipfile``
    tools report CRC errors); autockpt's manifest checksum still covers every byte. Where this
    torch lacks one of those names (:mod:`.internals`), it falls back to ``torch.save``.
    """
    keeper = WriteErrorKeeper(file)
    try:
        if zip_crc32 or not _save_without_zip_crc(tree, keeper):
            torch.save(tree, keeper)  # type: ignore[arg-type]
    except Exception:
        if keeper.error is not None:
            raise keeper.error from None
        raise


def write_tree(file: IO[bytes], *, tree: Any, zip_crc32: bool = True) -> None:
    """:func:`save_tree` with the file first: the persist process's entry point
    (``PortableWrite("autockpt_torch.snapshot:write_tree", {"tree": ..., "zip_crc32": ...})``)."""
    save_tree(tree, file, zip_crc32=zip_crc32)


def _save_without_zip_crc(tree: Any, file: Any) -> bool:
    """torch.save's zip path with the record CRCs off; False (nothing written) if unavailable."""
    save = internals.serialization_into()
    writer = internals.writer_without_crc(file) if save is not None else None
    if writer is None:
        return False
    save(tree, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    file.flush()
    return True
