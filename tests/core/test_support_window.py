"""The support window says the same in README.md, pyproject.toml and constraints/oldest.txt."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def floors() -> dict[str, str]:
    """Each dependency's lower bound in pyproject.toml, by name (extras' markers dropped)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {"python": project["requires-python"].removeprefix(">=")}
    extras = project["optional-dependencies"]
    for extra in ("lightning", "keras"):
        for spec in [*project["dependencies"], *extras[extra]]:
            name, low = re.match(r"([A-Za-z0-9_.-]+)(?:\[.*\])?>=([0-9.]+)", spec).groups()  # type: ignore[union-attr]
            found.setdefault(name, low)
    jax = dict(re.match(r"([a-z]+)>=([0-9.]+)", spec).groups() for spec in extras["jax"])  # type: ignore[union-attr]
    found["keras on jax"], found["jax"] = jax["keras"], jax["jax"]
    return found


def readme_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Supported versions"):]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| ([^|]+?) \|", section, re.M)}


def test_the_readme_table_gives_pyproject_s_lower_bounds() -> None:
    low, rows = floors(), readme_rows()
    expected = {
        "Python": low["python"], "numpy": low["numpy"], "keras (TensorFlow, torch backends)": low["keras"],
        "tensorflow": low["tensorflow-cpu"], "keras on JAX (`[jax]`)": f"keras {low['keras on jax']}, jax {low['jax']}",
        "lightning": low["lightning"], "torchdata": low["torchdata"], "torch": low["torch"],
    }  # fmt: skip
    assert {name: rows.get(name) for name in expected} == expected
    assert low["tensorflow"] == low["tensorflow-cpu"]


def test_the_oldest_set_installs_the_floors() -> None:
    low = floors()
    pins = dict(re.findall(r"^([a-z-]+)==([0-9.]+)$", (ROOT / "constraints/oldest.txt").read_text(), re.M))
    for name in ("keras", "tensorflow-cpu", "lightning", "torchdata", "numpy", "safetensors"):
        assert pins[name].startswith(low[name]), (name, pins[name], low[name])
