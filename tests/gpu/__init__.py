"""Tests that need a CUDA GPU (skipped where ``torch.cuda.is_available()`` is False)."""
