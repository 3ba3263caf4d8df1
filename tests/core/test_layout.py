"""The tree shows the design: which part of ``autockpt_core`` may import which, and no framework.

Parts: ``policy`` (decisions) and ``persist`` (bytes) import only the base modules; the engine
(``session``, ``summary``) imports those two; ``cli`` may import everything and nothing but the
command lines (it and ``autockpt_bench``) imports it. No module of the core imports a framework,
an adapter or ``autockpt_bench``, with no exemption. The adapters reach the core through the
surface it lists (``autockpt_core.adapter_surface``) and never import each other. Checked on the
source (every ``import`` statement, including those inside functions), and by importing every
core module in a fresh interpreter.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import autockpt_core

ROOT = Path(autockpt_core.__file__).parent
BASE = {"autockpt_core.config", "autockpt_core.config_hints", "autockpt_core.config_locations",
        "autockpt_core.cloud_notice", "autockpt_core.deadline", "autockpt_core.polling_source", "autockpt_core.units",
        "autockpt_core.errors",
        "autockpt_core.preemption", "autockpt_core.rng"}
FRAMEWORKS = ("torch", "tensorflow", "keras", "lightning", "jax")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module ``name`` imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES)
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("policy", "persist", "cli"):
        return parts[1]
    if module in BASE:
        return "base"
    if module == "autockpt_core":
        return "api"
    return "engine"


# part -> parts of autockpt_core it may import
ALLOWED = {
    "base": {"base"},
    "policy": {"base", "policy"},
    "persist": {"base", "persist"},
    "engine": {"base", "policy", "persist", "engine"},
    "api": {"base", "policy", "persist", "engine"},
    "cli": {"base", "policy", "persist", "engine", "api", "cli"},
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_one_way(module: str) -> None:
    part = _part(module)
    inside = {m for m in _imports(module, MODULES[module]) if m == "autockpt_core" or m.startswith("autockpt_core.")}
    wrong = sorted(m for m in inside if _part(m) not in ALLOWED[part])
    assert not wrong, f"{module} ({part}) imports {wrong}; {part} may import only {sorted(ALLOWED[part])}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_framework_in_the_source(module: str) -> None:
    used = {m.split(".")[0] for m in _imports(module, MODULES[module])}
    assert not used & {*FRAMEWORKS, "autockpt_torch", "autockpt_lightning", "autockpt_keras", "autockpt_bench"}


def test_every_module_imports_without_a_framework() -> None:
    names = sorted(m for m in MODULES if not m.endswith("__main__"))
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"print(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_three_parts_are_packages() -> None:
    packages = {info.name for info in pkgutil.iter_modules([str(ROOT)]) if info.ispkg}
    assert packages == {"policy", "persist", "cli"}


ADAPTERS = {"autockpt_lightning": {"autockpt_keras"}, "autockpt_keras": {"autockpt_lightning"}}
"""Each adapter and the packages it must not import."""


@pytest.mark.parametrize(
    "path",
    sorted(p for package in (*ADAPTERS, "autockpt_torch") for p in (ROOT.parent / package).rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT.parent)),
)
def test_neither_adapter_imports_the_other_and_the_shared_torch_code_imports_neither(path: Path) -> None:
    package = path.relative_to(ROOT.parent).parts[0]
    forbidden = ADAPTERS.get(package, {"autockpt_lightning", "autockpt_keras"})
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            used.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            used.add(node.module.split(".")[0])
    assert not used & forbidden, f"{path} imports {sorted(used & forbidden)}"


def _core_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "autockpt_core")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "autockpt_core":
            module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES)
    return found


ADAPTER_MODULES = sorted(p for package in ("autockpt_lightning", "autockpt_keras", "autockpt_torch")
                         for p in (ROOT.parent / package).rglob("*.py"))  # fmt: skip


@pytest.mark.parametrize("path", ADAPTER_MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_adapters_reach_the_core_through_its_listed_surface(path: Path) -> None:
    from autockpt_core.adapter_surface import ADAPTER_SURFACE

    beyond = sorted(_core_imports(path) - ADAPTER_SURFACE)
    assert not beyond, f"{path} imports {beyond}, outside autockpt_core.adapter_surface.ADAPTER_SURFACE"


def test_nothing_outside_the_command_lines_imports_the_cli() -> None:
    outside = [p for p in ADAPTER_MODULES if any(m.startswith("autockpt_core.cli") for m in _core_imports(p))]
    assert not outside, outside
