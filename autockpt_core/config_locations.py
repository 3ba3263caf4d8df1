"""Where checkpoints go, as ``Config`` reads it: paths and URLs, the mirror, storage options.

Base: imported by :mod:`autockpt_core.config` (which re-exports :func:`path_of_location`) and by
the storage layer; imports only the errors.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .errors import ConfigError

LOCAL_SCHEMES = ("file://", "local://")


def path_of_location(location: str) -> str | None:
    """The filesystem path of a plain path or a ``file://``/``local://`` URL; None for other URLs."""
    for scheme in LOCAL_SCHEMES:
        if location.startswith(scheme):
            return location[len(scheme) :]
    return None if "://" in location else location


def _is_url(location: str | None) -> bool:
    return location is not None and path_of_location(location) is None


def check_mirror(value: Any, dirpath: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            "mirror", value, "must be a non-empty URL or directory", "pass e.g. mirror='s3://bucket/run', or None"
        )
    if _same_location(value, dirpath):
        raise ConfigError(
            "mirror", value, f"is dirpath={dirpath!r} itself",
            "point mirror to a second location (e.g. object storage), or drop it",
        )
    return value


def _same_location(a: str, b: str) -> bool:
    def norm(text: str) -> str:
        path = path_of_location(text)
        return text.rstrip("/") if path is None else os.path.abspath(os.path.expanduser(path))

    return norm(a) == norm(b)


def check_storage_options(value: Any, dirpath: str, mirror: str | None) -> dict[str, Any] | None:
    """A copy of ``storage_options`` (None or a mapping with string keys), refused when neither
    ``dirpath`` nor ``mirror`` is a URL."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            "storage_options",
            value,
            "is not a mapping of option names to values",
            "pass a dict such as {'endpoint_url': 'http://127.0.0.1:9000', 'key': ..., 'secret': ...}",
        )
    if not _is_url(dirpath) and not _is_url(mirror):
        where = f"dirpath={dirpath!r}" + (f" and mirror={mirror!r} are local directories" if mirror else " is a local directory")
        raise ConfigError(
            "storage_options",
            dict(value),
            f"applies to fsspec URLs, but {where}",
            "use a URL such as dirpath='s3://bucket/run' or mirror='s3://bucket/run', or drop storage_options",
        )
    return dict(value)


def check_dirpath(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("dirpath", value, "must be a non-empty path", "pass a directory such as 'ckpts'")
    return value
