"""Tests of autockpt_lightning (mirrors the package)."""
