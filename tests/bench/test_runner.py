import importlib.util
from pathlib import Path

from autockpt_bench.study.runner import PACKAGES, compile_packages


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
