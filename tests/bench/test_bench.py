"""``autockpt bench``: the measurement helpers its workers share, the floors, the summary
ratios and tables, and the command itself."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import pytest

from autockpt_bench import bench as cli_bench
from autockpt_bench import cli
from autockpt_bench import demo as cli_demo
from autockpt_bench.workers import floors
from autockpt_bench.workers import measure as bench


def test_mlp_layout_and_result_lines() -> None:
    width, layers = bench.mlp_layout(100_000_000)
    assert layers == bench.LAYERS
    assert abs(3 * 4 * layers * width * width - 100_000_000) / 100_000_000 < 0.01
    assert bench.parse_result("noise\nBENCH-RESULT {\"a\": 1}\n") == {"a": 1}
    assert bench.parse_result("nothing") is None
    assert bench.peak_rss_bytes() > 0


def test_floors_measure_in_the_given_directory(tmp_path) -> None:
    assert floors.memcpy_floor(1 << 16, reps=3)["memcpy_s"] > 0
    assert floors.raw_write_floor(1 << 16, str(tmp_path), reps=1) > 0
    assert floors.safetensors_persist(1 << 16, str(tmp_path), reps=1)["safetensors_bytes"] > 1 << 16
    assert os.listdir(tmp_path) == []  # files removed


def _run(framework: str, method: str, step_s: float, stall_s: float | None = None, rss: int = 1000, **extra: Any) -> dict[str, Any]:
    out = {"framework": framework, "method": method, "mean_step_s": step_s, "state_bytes": 100, "peak_rss_bytes": rss}
    if stall_s is not None:
        out.update(stall_s=stall_s, persist_s=1.0, file_bytes=100)
    return {**out, **extra}


def test_summarize_derives_the_ratios() -> None:
    results = {
        "settings": {"every": 10},
        "machine": {"description": "test machine"},
        "date": "today",
        "command": "autockpt bench",
        "sizes": [
            {
                "nominal_bytes": 100,
                "floor": {"state_bytes": 100, "memcpy_s": 0.5, "raw_write_s": 0.5, "safetensors_persist_s": 1.0, "safetensors_bytes": 100},
                "persist": {"state_bytes": 100, "snapshot_s": 0.75, "autockpt_ckpt_s": 1.0, "autockpt_ckpt_zipcrc_s": 2.0,
                            "torch_save_fsync_s": 1.0, "lightning_io_s": 1.0},
                "runs": [
                    _run("lightning", "none", 1.0),
                    _run("lightning", "none", 1.2),
                    _run("lightning", "autockpt", 1.21, stall_s=0.75, rss=1150, copy_mode="sync"),
                    _run("lightning", "autockpt-auto", 1.15, stall_s=0.5, rss=1150, copy_mode="overlap"),
                    _run("lightning", "modelcheckpoint", 2.1, stall_s=5.0, rss=1100, fsync=False),
                ],
            }
        ],
    }
    cli_bench.summarize(results)
    entry = results["sizes"][0]
    rows = {r["method"]: r for r in entry["rows"]}
    assert rows["none"]["baseline_noise"] == pytest.approx(0.2 / 1.1)
    ours = rows["autockpt"]
    assert ours["stall_floor"] == pytest.approx(1.5)
    assert ours["persist_raw"] == pytest.approx(0.5)
    assert ours["mem_ratio"] == pytest.approx(1.5)
    assert ours["slowdown"] == pytest.approx(0.1)
    assert ours["slowdown_vs_modelcheckpoint"] == pytest.approx(0.1 / (2.1 / 1.1 - 1))
    assert entry["isolated"]["snapshot_floor"] == pytest.approx(1.5)
    assert entry["isolated"]["autockpt_safetensors_raw"] == pytest.approx(0.5)
    text = cli_bench.markdown(results)
    assert "test machine" in text and "| 100B | lightning | autockpt (sync copy, persist process) |" in text
    assert "| autockpt (copy mode measured, kept overlap, persist process) |" in text


def test_bench_is_a_cli_command(tmp_path, capsys) -> None:
    assert "bench" in cli.COMMANDS
    assert cli.main(["bench", "--help"]) == 0
    assert "--sizes" in capsys.readouterr().out
    assert cli.main(["bench", "--sizes", "0MB", "--dir", str(tmp_path)]) == 2
    assert cli.main(["bench", "--sizes", "1MB", "--methods", "autockpt,fastest", "--dir", str(tmp_path)]) == 2


def test_machine_info_names_the_cpu() -> None:
    info = cli_bench.machine_info()
    assert info["cores"] >= 1 and info["cpu"]
    json.dumps(info)


def test_step_times_take_the_median_checkpoint_interval() -> None:
    marks = {s: float(s) for s in range(4, 35)}
    marks[20] += 50.0  # a load spike in one interval
    for s in range(21, 35):
        marks[s] += 50.0
    out = bench.step_times(marks, warm=4, every=10)
    assert out["intervals_s"] == [10.0, 60.0, 10.0]
    assert out["median_step_s"] == 1.0
    assert out["mean_step_s"] == pytest.approx(80.0 / 30)


def test_repeated_runs_are_aggregated_by_median() -> None:
    runs = [_run("keras", "autockpt", s, stall_s=s) for s in (1.0, 3.0, 2.0)]
    agg = cli_bench._aggregate(runs)
    assert agg["mean_step_s"] == 2.0 and agg["stall_s"] == 2.0 and agg["runs"] == 3 and agg["method"] == "autockpt"


def test_stall_is_summed_per_checkpoint_interval() -> None:
    marks = {s: float(s) for s in range(4, 25)}
    hooks = [(3.5, 9.0), (10.1, 0.5), (11.2, 0.1), (20.1, 0.2), (21.0, 0.1)]  # first: before warm-up ends
    out = bench.stall_figures(hooks, marks, warm=4, every=10)
    assert out["checkpoints"] == 2
    assert out["stall_first_s"] == pytest.approx(0.6) and out["stall_s"] == pytest.approx(0.45)


def test_every_worker_the_commands_start_exists() -> None:
    modules = list(cli_bench.WORKERS.values()) + [argv[argv.index("-m") + 1] for argv in cli_demo.FRAMEWORKS.values()]
    assert len(modules) == 5
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
