import importlib.util
from pathlib import Path

import pytest

from autockpt_bench.study.runner import PACKAGES, compile_packages, worker_env


def test_compile_packages_leaves_every_autockpt_module_compiled() -> None:
    """Workers then load autockpt from compiled files, as they load the frameworks."""
    import autockpt_core.persist.whole_read as module

    Path(importlib.util.cache_from_source(module.__file__)).unlink(missing_ok=True)
    compile_packages()
    sources = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations
        sources += list(Path(next(iter(spec.submodule_search_locations))).rglob("*.py"))
    assert len(sources) > 100
    missing = [s for s in sources if not Path(importlib.util.cache_from_source(str(s))).exists()]
    assert missing == []


def test_every_worker_gets_the_same_fixed_allocator_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else a worker that freed a checkpoint buffer trains faster than one that never did."""
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    env = worker_env(1, "torch")
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20) and env["MALLOC_TRIM_THRESHOLD_"] == str(64 << 20)
    assert env["KERAS_BACKEND"] == "torch" and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")  # the user's own choice wins
    assert worker_env(1)["MALLOC_MMAP_THRESHOLD_"] == "262144"
