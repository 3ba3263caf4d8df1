"""torch.save for the persist process: the pickle is made here, the bytes are written there.

The persist process must never unpickle the training script's objects: a dataclass of
hyper-parameters, an enum or a callback's state defined in the script's ``__main__`` does not
exist in that process. So :func:`portable_tree_write` gives the persist process a write it
can run without them:

1. here (writer thread), torch.save's own serialization runs into a recording zip writer:
   ``data.pkl`` (the pickle of the whole tree, user objects included) and the other small
   records are kept as bytes, each storage as a :class:`SharedRef` to its range of the
   shared snapshot buffers (small storages outside them as bytes);
2. there, :func:`write_records` replays the records into torch's zip writer in the same
   order over the same memory: the file torch.save writes.

Its unpickler only needs builtins and autockpt's ``SharedRef``. Where the records cannot be
made (this torch lacks a private name of :mod:`.internals`, or large storages lie outside the
shared buffers), the writer thread writes the checkpoint with :func:`~.snapshot.write_tree`
instead.
"""

from __future__ import annotations

import logging
import pickle
from typing import IO, Any

import torch

from autockpt_core.persist.persist_process import PortableWrite
from autockpt_core.persist.shared_memory import INLINE_LIMIT, SharedArena, SharedRef

from . import internals
from .snapshot import WRITE_TREE, WriteErrorKeeper

log = logging.getLogger("autockpt")

WRITE_RECORDS = "autockpt_torch.process_write:write_records"
""":func:`write_records` by name: the persist process's entry point."""
STORAGE_VIEW = "autockpt_torch.process_write:storage_view"


def portable_tree_write(tree: Any, process_function: str = WRITE_RECORDS, *, zip_crc32: bool = True) -> PortableWrite:
    """``torch.save(tree, file)`` as a :class:`PortableWrite`: ``write_tree`` in the writer
    thread, :func:`write_records` (or ``process_function``, same signature) in the persist
    process."""

    def for_process(arena: SharedArena) -> PortableWrite | None:
        records = record_tree(tree, arena)
        if records is None:
            return None
        return PortableWrite(process_function, {"records": records, "zip_crc32": zip_crc32})

    return PortableWrite(WRITE_TREE, {"tree": tree, "zip_crc32": zip_crc32}, for_process=for_process)


class _Recorder:
    """Stands in for ``torch._C.PyTorchFileWriter`` in ``torch.serialization._save``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Any, int]] = []

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        self.records.append((name, data, int(nbytes)))


def record_tree(tree: Any, arena: SharedArena) -> list[tuple[str, bytes | str | SharedRef, int]] | None:
    """torch.save's records of ``tree``: bytes and references into ``arena``; None when they
    cannot be made (see the module docstring). Writer thread."""
    if not internals.process_records_supported():
        return None
    save = internals.serialization_into()
    recorder = _Recorder()
    try:
        save(tree, recorder, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    except Exception as exc:  # noqa: BLE001 - the writer thread's torch.save raises it if it is real
        log.debug("autockpt: torch.save's records could not be made here (%s); the writer thread writes", exc)
        return None
    out: list[tuple[str, bytes | str | SharedRef, int]] = []
    inline = 0
    for name, data, nbytes in recorder.records:
        if isinstance(data, (bytes, str)):
            out.append((name, data, nbytes))
            continue
        located = arena.locate(data.data_ptr(), nbytes) if nbytes else None
        if located is not None:
            out.append((name, SharedRef(located[0], located[1], nbytes, STORAGE_VIEW, "uint8", (nbytes,)), nbytes))
            continue
        inline += nbytes
        if inline > INLINE_LIMIT:
            return None
        raw = torch.empty(0, dtype=torch.uint8).set_(data) if nbytes else torch.empty(0, dtype=torch.uint8)
        out.append((name, raw.numpy().tobytes(), nbytes))
    return out


def storage_view(memory: Any, offset: int, _dtype: Any, shape: tuple[int, ...]) -> torch.UntypedStorage:
    """The bytes at ``offset`` of a mapped segment as a storage (persist process)."""
    return torch.frombuffer(memory, dtype=torch.uint8, count=shape[0], offset=offset).untyped_storage()


def write_records(file: IO[bytes], *, records: list[tuple[str, Any, int]], zip_crc32: bool = True) -> None:
    """Write recorded torch.save records into ``file`` as torch's zip writer does (persist process).

    ``zip_crc32`` (the default): with the zip's own per-record CRC-32, a second pass on top of
    the manifest's checksum; without it zip tools reject the file (docs/benchmarks.md). Where
    torch lacks the private writer the CRC-less path needs
    (:func:`~autockpt_torch.internals.writer_without_crc`), the records are written with the
    CRC, as :func:`~autockpt_torch.snapshot.save_tree` does. Only called with records
    :func:`record_tree` made, so torch's zip writer exists here."""
    keeper = WriteErrorKeeper(file)
    try:
        writer = None if zip_crc32 else internals.writer_without_crc(keeper)
        if writer is None:
            with internals.zipfile_writer()(keeper) as zip_writer:
                _replay(zip_writer, records)
            return
        _replay(writer, records)
        writer.write_end_of_file()
        keeper.flush()
    except Exception:
        if keeper.error is not None:
            raise keeper.error from None
        raise


def _replay(writer: Any, records: list[tuple[str, Any, int]]) -> None:
    for name, data, nbytes in records:
        writer.write_record(name, data, nbytes)
