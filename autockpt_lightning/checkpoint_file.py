"""The Lightning checkpoint file: a standard ``.ckpt`` (``torch.save`` of ``dump_checkpoint``).

``trainer.fit(ckpt_path=...)`` and ``LightningModule.load_from_checkpoint`` accept the files;
the manifest lists them under ``FRAMEWORK`` with their checksums. A sharded model's checkpoint
(``ModelParallelStrategy``, :mod:`.sharded`) is a directory of that name instead, laid out as
Lightning's own sharded checkpoints (``trainer.fit(ckpt_path=...)`` accepts it).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from autockpt_core import find_latest_valid, storage_for
from autockpt_core.persist import location_of

FRAMEWORK = "lightning"
SUFFIX = ".ckpt"


def latest_checkpoint(
    dirpath: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> str | None:
    """Path (or URL) of the newest Lightning checkpoint in ``dirpath`` whose file (or, for a
    sharded model, every file of its directory) matches the manifest (``storage_options``: as
    the callback's, for a URL ``dirpath``).

    Corrupt or torn newer files are skipped with a warning; None when there is none.
    """
    storage = storage_for(dirpath, storage_options)
    record = find_latest_valid(storage, framework=FRAMEWORK)
    return None if record is None else location_of(storage, record.name)
