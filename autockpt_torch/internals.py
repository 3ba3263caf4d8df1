"""Every private torch name the torch code touches, behind one small function each.

torch.save's zip writing is public only as ``torch.save(obj, file)``. Two of autockpt's writes
need its insides:

- the persist process (:mod:`.process_write`) records torch.save's output in the writer
  thread and replays it in another process: ``torch.serialization._save`` (the serialization
  into a writer object) and ``torch.serialization._open_zipfile_writer`` (torch's zip writer
  over a file object);
- ``zip_crc32=False`` (:mod:`.snapshot`, :mod:`.process_write`) opens torch's zip writer with
  the record CRCs off: ``torch._C.PyTorchFileWriter(file, False, alignment)`` with the
  alignment from ``torch.serialization._get_storage_alignment``.

Neither is needed to write a correct checkpoint: without the first the writer thread writes
the file with ``torch.save`` (no persist process); without the second the records keep their
CRC-32. The callers get None from the accessors here and take those paths; no
``AttributeError`` or ``TypeError`` reaches a save. :func:`check_internals` (the Lightning
callback's ``setup("fit")``) logs one warning per missing name, saying what is off.

Checked against torch 2.13 (the CPU build every test run here uses; torch 2.6 had no
``_get_storage_alignment``, so ``zip_crc32=False`` kept the CRCs there). The canaries in
``tests/compat/test_torch_internals.py`` check every name on the installed torch and write a
checkpoint with each one taken away.

Threading: read-only lookups, on the thread that writes (the writer thread, or the persist
process).
"""

from __future__ import annotations

import functools
import io
from typing import Any

import torch

from autockpt_core.internals_door import MISSING, Internal, absent, lookup, report_missing

_PROCESS = "torch.save's records replayed in the persist process (the writer thread writes without it)"
_CRC_OFF = "zip_crc32=False (each record keeps its zip CRC-32 without it)"

INTERNALS: dict[str, Internal] = {
    "save": Internal("torch.serialization", "_save", _PROCESS, exactness=False),
    "open_zipfile_writer": Internal("torch.serialization", "_open_zipfile_writer", _PROCESS, exactness=False),
    "storage_alignment": Internal("torch.serialization", "_get_storage_alignment", _CRC_OFF, exactness=False),
    "file_writer": Internal("torch._C", "PyTorchFileWriter", _CRC_OFF, exactness=False),
}
"""The private torch names, by key. Where each lives: the ``owner`` module."""


def _read(key: str) -> Any | None:
    holder = torch.serialization if INTERNALS[key].owner == "torch.serialization" else torch._C
    value = lookup(INTERNALS, holder, key)
    return None if value is MISSING else value


def serialization_into() -> Any | None:
    """``torch.serialization._save(obj, writer, pickle_module, protocol, use_new_zipfile)``: torch.save's
    serialization into any object with ``write_record(name, data, nbytes)``; None where absent."""
    return _read("save")


def zipfile_writer() -> Any | None:
    """``torch.serialization._open_zipfile_writer(file)``: a context manager giving torch's zip
    writer over a file object (``write_record``; the end of the archive on exit); None where absent."""
    return _read("open_zipfile_writer")


def process_records_supported() -> bool:
    """Both names the persist process's replay of torch.save needs exist in this torch."""
    return serialization_into() is not None and zipfile_writer() is not None


def writer_without_crc(file: Any) -> Any | None:
    """torch's zip writer over ``file`` with the record CRCs off (``write_record``, then
    ``write_end_of_file``); None where this torch lacks a name or takes other arguments."""
    alignment, writer_type = _read("storage_alignment"), _read("file_writer")
    if alignment is None or writer_type is None or not _takes_crc_switch(writer_type, alignment):
        return None
    return writer_type(file, False, alignment())


@functools.lru_cache(maxsize=None)
def _takes_crc_switch(writer_type: Any, alignment: Any) -> bool:
    """``writer_type(file, compute_crc32, alignment())`` is accepted (probed once, on a buffer)."""
    try:
        writer = writer_type(io.BytesIO(), False, alignment())
    except TypeError:  # another constructor signature
        return False
    writer.write_end_of_file()
    return True


def missing() -> list[Internal]:
    """The internals this torch lacks."""
    return absent(
        INTERNALS,
        [
            (torch.serialization, ("save", "open_zipfile_writer", "storage_alignment")),
            (torch._C, ("file_writer",)),
        ],
    )


def check_internals() -> None:
    """Log one warning per private torch name this torch lacks, saying what is off without it."""
    report_missing(missing(), f"torch {torch.__version__}", stacklevel=4)
