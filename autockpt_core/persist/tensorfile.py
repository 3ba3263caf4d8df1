"""Streaming writer and reader for the safetensors file format, over numpy arrays.

The writer streams each array's bytes straight from its (reusable) buffer to the file: no
serialized copy of the whole state is built in memory, unlike ``safetensors.numpy.save``.
Files are standard safetensors: ``safetensors.safe_open`` and ``safetensors.numpy.load_file``
read them (tested). Layout: 8-byte little-endian header length, a JSON header padded with
spaces to a multiple of 8, then the tensors' bytes back to back.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any, Mapping

import numpy as np

WRITE_TENSORS = "autockpt_core.persist.tensorfile:write_tensor_file"
""":func:`write_tensor_file` by name, for the persist process (``PortableWrite``)."""

_TO_ST = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
}
_FROM_ST = {v: k for k, v in _TO_ST.items()}


def _st_dtype(array: np.ndarray) -> str:
    try:
        return _TO_ST[array.dtype.name]
    except KeyError:
        raise TypeError(f"dtype {array.dtype} cannot be stored in a safetensors file") from None


def build_header(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length prefix plus the padded JSON header for ``arrays`` in iteration order."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, array in arrays.items():
        end = offset + int(array.nbytes)
        header[name] = {"dtype": _st_dtype(array), "shape": list(array.shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_tensor_file(
    out: IO[bytes], arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> int:
    """Write ``arrays`` (C-contiguous) and string ``metadata`` to ``out``; returns bytes written."""
    head = build_header(arrays, metadata)
    out.write(head)
    total = len(head)
    for name, array in arrays.items():
        if not array.flags.c_contiguous:
            raise ValueError(f"tensor {name!r} is not C-contiguous; copy it into a contiguous buffer first")
        if array.nbytes:
            out.write(memoryview(array.reshape(-1).view(np.uint8)))
        total += int(array.nbytes)
    return total


def read_tensor_file(
    data: bytes | memoryview | np.ndarray, copy: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Parse a safetensors file's bytes; returns (arrays, metadata). Arrays are copies, or with
    ``copy=False`` views into ``data`` (which they keep alive; writable where ``data`` is)."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise ValueError("file too short for a safetensors header")
    (length,) = struct.unpack("<Q", view[:8])
    if length > len(view) - 8:
        raise ValueError("safetensors header length exceeds the file size (truncated file?)")
    header = json.loads(bytes(view[8 : 8 + length]).decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    body = view[8 + length :]
    arrays: dict[str, np.ndarray] = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        if end > len(body):
            raise ValueError(f"tensor {name!r} runs past the end of the file (truncated file?)")
        dtype = _numpy_dtype(info["dtype"])
        flat = np.frombuffer(body[start:end], dtype=dtype)
        shaped = flat.reshape(info["shape"])
        arrays[name] = shaped.copy() if copy else shaped
    return arrays, dict(metadata)


def _numpy_dtype(st: str) -> Any:
    name = _FROM_ST.get(st)
    if name is None:
        raise ValueError(f"unknown safetensors dtype {st!r}")
    if name == "bfloat16":
        import ml_dtypes  # shipped with JAX and Keras

        return ml_dtypes.bfloat16
    return np.dtype(name)
