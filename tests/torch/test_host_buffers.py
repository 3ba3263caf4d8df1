"""autockpt_torch/host_buffers.py: the host copy into reusable buffers."""

from __future__ import annotations

import torch

from autockpt_torch.host_buffers import host_copy

torch.set_num_threads(1)
MiB = 2**20


def test_host_copy_handles_bfloat16_views_and_non_contiguous() -> None:
    for src in (torch.randn(5, 3).to(torch.bfloat16), torch.randn(4, 6).t(), torch.tensor(2.5), torch.empty(0)):
        dst = torch.empty(src.shape, dtype=src.dtype)
        host_copy(dst, src)
        assert torch.equal(dst, src)
