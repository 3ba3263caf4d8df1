"""autockpt_torch/host_buffers.py: the host copy into reusable buffers."""

from __future__ import annotations

import subprocess
import sys

import torch

from autockpt_torch.host_buffers import host_copy

torch.set_num_threads(1)
MiB = 2**20


def test_host_copy_handles_bfloat16_views_and_non_contiguous() -> None:
    for src in (torch.randn(5, 3).to(torch.bfloat16), torch.randn(4, 6).t(), torch.tensor(2.5), torch.empty(0)):
        dst = torch.empty(src.shape, dtype=src.dtype)
        host_copy(dst, src)
        assert torch.equal(dst, src)


_EXIT_DURING_PREFAULT = """
import sys, time, torch
torch.set_num_threads(1)
from autockpt_torch.host_buffers import torch_buffer_pool
pool = torch_buffer_pool()
assert pool.prefault([(f"t{i}", (32, 32), torch.float32) for i in range(20000)])
time.sleep(float(sys.argv[1]))
"""


def test_a_process_that_exits_while_buffers_are_prefaulted_exits_cleanly() -> None:
    # A daemon prefault thread inside torch's C++ code when Python finalized aborted the
    # process ("terminate called without an active exception", exit -6): a run that ended a
    # few steps after its first prefault began died after training. Exits at several moments
    # of the 20000 small allocations; the old daemon thread aborted at each of these here.
    for delay in ("0.02", "0.05", "0.1"):
        proc = subprocess.run([sys.executable, "-c", _EXIT_DURING_PREFAULT, delay], capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, (delay, proc.returncode, proc.stderr[-2000:])
