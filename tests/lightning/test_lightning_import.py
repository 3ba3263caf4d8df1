"""What ``import autockpt_lightning`` adds to a process that already imported Lightning.

Every restart pays it before its first step. torch.distributed.checkpoint (about 50 ms here)
is imported only by a fit under a sharded strategy, and PyYAML only to read a YAML config.
"""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import lightning.pytorch
before = set(sys.modules)
import autockpt_lightning
print(",".join(sorted(set(sys.modules) - before)))
"""


def test_the_import_loads_neither_distributed_checkpointing_nor_yaml() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    added = set(out.stdout.strip().splitlines()[-1].split(","))
    assert "autockpt_lightning.sharded" in added  # the module is there; what it needs comes later
    assert not {m for m in added if m.startswith("torch.distributed.checkpoint")}
    assert "yaml" not in added
