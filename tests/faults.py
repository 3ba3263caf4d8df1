"""Storage wrappers that fail on purpose, shared by core and adapter tests."""

from __future__ import annotations

import errno
from typing import IO, Callable

from autockpt_core.persist.storage import LocalStorage, WriteResult


class _FailingFile:
    """Passes writes through until ``fail_after`` bytes, then raises ``error``."""

    def __init__(self, raw: IO[bytes], fail_after: int, error: OSError) -> None:
        self._raw, self._left, self._error = raw, fail_after, error

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= self._left:
            self._raw.write(view[: self._left])
            self._left = 0
            raise self._error
        self._left -= len(view)
        return self._raw.write(view)

    def flush(self) -> None:
        self._raw.flush()

    def tell(self) -> int:
        return self._raw.tell()


class FailingStorage(LocalStorage):
    """LocalStorage whose checkpoint writes fail mid-file (ENOSPC by default) once armed.

    ``fail_names`` selects which names fail (default: anything but the manifest).
    """

    def __init__(self, root, fail_after: int = 1000, error: OSError | None = None) -> None:
        super().__init__(root)
        self.armed = False
        self.fail_after = fail_after
        self.error = error or OSError(errno.ENOSPC, "No space left on device")
        self.failures = 0

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if not self.armed or name.endswith(".json"):
            return super().write_atomic(name, write)

        def failing_write(f: IO[bytes]) -> object:
            self.failures += 1
            return write(_FailingFile(f, self.fail_after, self.error))  # type: ignore[arg-type]

        return super().write_atomic(name, failing_write)
