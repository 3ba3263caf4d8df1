"""Tests of autockpt_torch (mirrors the package)."""
