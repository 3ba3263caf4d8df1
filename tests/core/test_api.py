import subprocess
import sys

import autockpt_core


def test_all_is_exactly_the_public_api() -> None:
    public = {n for n in dir(autockpt_core) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(autockpt_core, n)).__name__ == "module"}
    assert set(autockpt_core.__all__) == public - modules
    assert {"young_interval", "daly_interval", "Config", "CheckpointSession"} <= set(autockpt_core.__all__)


def test_core_imports_no_framework() -> None:
    code = (
        "import sys, autockpt_core, autockpt_core.cli;"
        "bad=[m for m in ('torch','tensorflow','keras','lightning','jax') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
