"""``autockpt compare``: settings, the per-method rows and targets, and the whole command on
stand-in workers (real processes, one per run; ``fake_study_worker``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from autockpt_bench import cli
from autockpt_bench import compare as cli_compare
from autockpt_bench.study import report
from autockpt_bench.study.workloads import FULL, QUICK, Workload, make_data, param_count

REPO = Path(__file__).resolve().parents[3]
FAKE = {"lightning": "tests.bench.fake_study_worker", "keras": "tests.bench.fake_study_worker"}


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [("small", 0.8e6, 1.3e6), ("medium", 8e6, 12e6), ("large", 100e6, 130e6)],
)
def test_full_workloads_have_the_sizes_the_study_names(name: str, low: float, high: float) -> None:
    assert low <= FULL[name].params <= high
    assert FULL["large"].state_bytes > 1 << 30  # "training state over 1 GB with Adam"


def test_param_count_of_a_tiny_cnn_by_hand() -> None:
    w = Workload("t", "cnn", {"image": 8, "channels": (4, 8), "blocks": (1, 1), "classes": 3}, batch=2, steps_per_epoch=1)
    stem = 9 * 3 * 4 + 8
    stage1 = 9 * 4 * 4 + 8 + 9 * 4 * 4 + 8
    stage2 = 9 * 4 * 8 + 16 + 9 * 8 * 8 + 16 + 4 * 8 + 16
    assert param_count(w) == stem + stage1 + stage2 + 8 * 3 + 3


def test_data_is_the_same_for_both_frameworks_and_shaped_per_kind() -> None:
    for w in QUICK.values():
        x1, y1 = make_data(w, 3)
        x2, y2 = make_data(w, 3)
        assert (x1 == x2).all() and (y1 == y2).all() and len(x1) == 3 * w.batch
    x, y = make_data(QUICK["large"], 2)
    assert x.shape == y.shape == (4, QUICK["large"].dims["seq"]) and x.max() < QUICK["large"].dims["vocab"]
    assert Workload.from_json(json.loads(json.dumps(QUICK["medium"].to_json()))) == QUICK["medium"]


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return cli.build_parser().parse_args(["compare", *argv])


def test_settings_and_methods() -> None:
    s = cli_compare.settings_from_args(_args("--quick"))
    assert (s["every"], s["checkpoints"], s["warmup"], s["repeats"], s["budgets"], s["ab_cycles"]) == (5, 3, 3, 1, [0.02], 0)
    assert s["steps"] == 3 * 5 + 2 and s["steps"] % s["every"]  # checkpoints at 5, 10, 15; the last steps are restored
    full = cli_compare.settings_from_args(_args())
    assert full["budgets"] == [0.01, 0.02, 0.05]
    keys = [report.method_key(m) for m in cli_compare.plan_methods("keras", full, set())]
    assert keys == ["none", "none-long", "autockpt", "autockpt-budget-1%", "autockpt-ab-1%", "autockpt-budget-2%",
                    "autockpt-ab-2%", "autockpt-budget-5%", "autockpt-ab-5%", "modelcheckpoint-h5", "modelcheckpoint-keras",
                    "backup-restore", "orbax", "tf-manager"]
    # odd repetitions run the methods in reverse, each A/B still right after its budget run
    reverse = [report.method_key(m) for m in cli_compare._ordered(cli_compare.plan_methods("keras", full, set()), 1)]
    assert reverse[:5] == ["none", "tf-manager", "orbax", "backup-restore", "modelcheckpoint-keras"]
    assert reverse[6:12] == ["autockpt-budget-5%", "autockpt-ab-5%", "autockpt-budget-2%", "autockpt-ab-2%",
                             "autockpt-budget-1%", "autockpt-ab-1%"]
    assert [report.method_key(m) for m in cli_compare.plan_methods("keras", full, {"autockpt-budget-2%"})] == \
        ["none", "none-long", "autockpt-budget-2%", "autockpt-ab-2%"]
    no_ab = cli_compare.settings_from_args(_args("--ab-cycles", "0"))
    assert "autockpt-ab" not in [m["name"] for m in cli_compare.plan_methods("keras", no_ab, set())]
    with pytest.raises(ValueError, match="--ab-cycles"):
        cli_compare.settings_from_args(_args("--ab-cycles", "1"))
    assert [m["name"] for m in cli_compare.plan_methods("lightning", full, {"async"})] == ["none", "async"]
    with pytest.raises(ValueError, match="--budgets"):
        cli_compare.settings_from_args(_args("--budgets", "150%"))
    assert cli.main(["compare", "--frameworks", "pytorch"]) == 2


def test_quick_runs_what_its_help_says(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The small workload only, every method, one repetition, no A/B, two restore runs per framework:
    15 runs and 4 restore runs, about 2 minutes on the project's 2-core machine."""
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option: no words broken at hyphens
    assert cli.main(["compare", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--quick the small workload (scaled down), every method, few steps, one repetition, no in-process A/B, " \
        "restore runs for autockpt and the synchronous ModelCheckpoint only (about 2 minutes on a 2-core machine)" in help_text
    assert "(default small,medium,large; quick small)" in help_text and "(default 4; quick 0; 0 = none)" in help_text
    quick = cli_compare.settings_from_args(_args("--quick"))
    methods = {f: cli_compare.plan_methods(f, quick, set()) for f in ("lightning", "keras")}
    assert [report.method_key(m) for m in methods["lightning"]] == [
        "none", "none-long", "autockpt", "autockpt-budget-2%", "modelcheckpoint", "async"]
    assert len(methods["keras"]) == 9
    restored = {f: [m["name"] for m in ms if cli_compare._restores(f, m, quick)] for f, ms in methods.items()}
    assert restored == {"lightning": ["autockpt", "modelcheckpoint"], "keras": ["autockpt", "modelcheckpoint-h5"]}
    assert cli_compare.DEFAULTS["workloads"][True] == "small" and quick["repeats"] == 1
    full = cli_compare.settings_from_args(_args())
    assert full["ab_cycles"] == 4 and all(cli_compare._restores("keras", m, full)
                                          for m in cli_compare.plan_methods("keras", full, set())
                                          if m["name"] not in ("none", "autockpt-ab"))


def _train(step_s: float, blocked: list[float], rss: int = 100, steps: list[int] | None = None) -> dict:
    return {"step_s": step_s, "step_s_median": step_s, "blocked_s": blocked, "save_s": blocked,
            "checkpoint_steps": steps if steps is not None else [10 * (i + 1) for i in range(len(blocked))],
            "checkpoint_bytes": 50, "format": ".x", "peak_rss_bytes": rss, "params": 1, "state_bytes": 100}


def test_rows_pair_each_repetition_with_its_own_baseline_and_check_the_targets() -> None:
    runs = []
    for rep, noise in enumerate((1.0, 2.0)):  # the second repetition runs on a twice slower machine
        runs += [
            {"framework": "lightning", "workload": "small", "method": {"name": "none"}, "rep": rep,
             "train": _train(0.1 * noise, [], rss=100), "restore": None},
            {"framework": "lightning", "workload": "small", "method": {"name": "modelcheckpoint", "every": 10}, "rep": rep,
             "train": _train(0.12 * noise, [0.5, 0.4]), "restore": {"restore_s": 3.0, "load_s": 0.5, "max_abs_diff": 0.1, "exact": False}},
            {"framework": "lightning", "workload": "small", "method": {"name": "autockpt", "every": 10}, "rep": rep,
             "train": _train(0.101 * noise, [0.05, 0.01], rss=300), "restore": {"restore_s": 2.0, "load_s": 0.2, "max_abs_diff": 0.0, "exact": True}},
            {"framework": "lightning", "workload": "small", "method": {"name": "autockpt-budget", "budget": 0.02}, "rep": rep,
             "train": _train(0.103 * noise, [0.01], steps=[40]), "restore": None},
            {"framework": "lightning", "workload": "small", "method": {"name": "none", "long": True}, "rep": rep,
             "train": _train(0.1015 * noise, []), "restore": None},  # long runs cross epoch ends: a bit slower
        ]
    rows = {r["method"]: r for r in report.summarize(runs)}
    assert rows["modelcheckpoint"]["slowdown"] == pytest.approx(0.2)  # same in both repetitions
    assert rows["autockpt"]["slowdown"] == pytest.approx(0.01)
    assert rows["autockpt"]["blocked_vs_native_sync"] == pytest.approx(0.03 / 0.45)
    assert rows["autockpt"]["extra_rss_bytes"] == 200 and rows["autockpt"]["exact"] is True
    assert rows["modelcheckpoint"]["exact"] is False and rows["modelcheckpoint"]["max_abs_diff"] == 0.1
    assert rows["autockpt-budget-2%"]["interval_steps"] is None and rows["autockpt-budget-2%"]["first_checkpoint_step"] == 40
    assert rows["autockpt-budget-2%"]["slowdown"] == pytest.approx(0.103 / 0.1015 - 1)  # paired with the long baseline
    assert rows["none-long"]["kind"] == "none" and rows["none-long"]["slowdown"] == pytest.approx(0.0)
    verdicts = [report.verdict(t) for t in report.targets(list(rows.values()))]
    # blocked 0.067× native: met; the budget row's baselines differ by 100% between the two
    # repetitions, so a slowdown of 1.5% cannot be told from noise against a 2% budget
    assert verdicts == ["met", "below noise"]
    assert rows["autockpt-budget-2%"]["baseline_spread"] == pytest.approx(0.1015 / 0.15225)
    text = report.table_rows(list(rows.values()))
    assert any("no (max |Δw| 0.1)" in cell for row in text for cell in row)


@pytest.mark.parametrize(
    ("budget_steps", "baseline_steps", "verdict"),
    [
        ((0.1015, 0.1016, 0.1017), (0.1, 0.1001, 0.1002), "met"),  # +1.5%, baselines 0.2% apart
        ((0.104, 0.1041, 0.1042), (0.1, 0.1001, 0.1002), "missed"),  # +4%
        ((0.1015, 0.104, 0.1017), (0.1, 0.103, 0.1002), "below noise"),  # baselines 3% apart
    ],
)
def test_each_budget_row_says_met_missed_or_below_the_machines_noise(budget_steps, baseline_steps, verdict) -> None:
    runs = []
    for rep, (ours, base) in enumerate(zip(budget_steps, baseline_steps)):
        runs += [
            {"framework": "keras", "workload": "small", "method": {"name": "none"}, "rep": rep,
             "train": _train(base, []), "restore": None},
            {"framework": "keras", "workload": "small", "method": {"name": "autockpt-budget", "budget": 0.02},
             "rep": rep, "train": {**_train(ours, [0.01, 0.01]), "reported_overhead": 0.012, "reported_band": 0.003},
             "restore": None},
        ]
    (target,) = report.targets(report.summarize(runs))
    assert report.verdict(target) == verdict and target["met"] == (verdict == "met")
    assert "autockpt reported 1.2% ±0.3" in target["measured"] and "baselines spread" in target["measured"]


def test_a_cost_in_every_step_shows_in_the_median_step_and_the_hook_time() -> None:
    """Mean steps 3% slower in both rows; the median step 3% slower only where every step pays
    (0.3 ms of hooks per step), not where a few steps around each checkpoint pay it all."""
    runs = []
    for rep in (0, 1):
        base = _train(0.01, [])
        every_step = {**_train(0.0103, [0.001]), "step_s_median": 0.0103, "hook_s_median": 0.0003}
        around = {**_train(0.0103, [0.001]), "step_s_median": 0.01, "hook_s_median": 0.00002}
        runs += [
            {"framework": "keras", "workload": "small", "method": {"name": "none"}, "rep": rep, "train": base,
             "restore": None},
            {"framework": "keras", "workload": "small", "method": {"name": "autockpt-budget", "budget": 0.02},
             "rep": rep, "train": every_step, "restore": None},
            {"framework": "keras", "workload": "small", "method": {"name": "autockpt-budget", "budget": 0.05},
             "rep": rep, "train": around, "restore": None},
        ]
    rows = {r["method"]: r for r in report.summarize(runs)}
    assert rows["autockpt-budget-2%"]["median_step_slowdown"] == pytest.approx(0.03)
    assert rows["autockpt-budget-5%"]["median_step_slowdown"] == pytest.approx(0.0)
    assert rows["autockpt-budget-2%"]["hook_ms"] == pytest.approx(0.3)
    measured = [t["measured"] for t in report.targets(list(rows.values()))]
    assert "median step +3.0%, hooks 0.30 ms per step" in measured[0] and "median step +0.0%" in measured[1]


@pytest.mark.parametrize(
    ("cycles", "hook_s", "verdict"),
    [
        ([0.010, 0.012, 0.011, 0.009], 0.00005, "met"),  # 1.05% + 0.5% hooks, ±0.21 (t, 3 dof)
        ([0.030, 0.032, 0.031, 0.029], 0.00005, "missed"),  # 3.05% + 0.5%
        ([0.000, 0.040, 0.010, 0.030], 0.00005, "below noise"),  # 2.0% + 0.5%, ±2.9
        ([0.016, 0.024, 0.016, 0.024], 0.00005, "below noise"),  # 2.0% + 0.5%, ±0.73; 2σ (±0.46) would say missed
    ],
)
def test_an_ab_row_pools_its_cycles_adds_the_hooks_and_says_met_missed_or_below_noise(cycles, hook_s, verdict) -> None:
    runs = [{"framework": "keras", "workload": "small", "method": {"name": "autockpt-ab", "budget": 0.02, "every": 7,
                                                                     "block": 21}, "rep": rep,
             "train": {**_train(0.01, [0.001]), "hook_s_median": hook_s, "ab_cycles": cycles[2 * rep:2 * rep + 2],
                       "ab_meter_view": 0.004}, "restore": None} for rep in (0, 1)]
    (row,) = report.summarize(runs)
    assert row["method"] == "autockpt-ab-2%" and row["every"] == 7 and row["ab_cycle_count"] == 4
    assert row["ab_overhead"] == pytest.approx(sum(cycles) / 4)
    assert row["ab_total"] == pytest.approx(sum(cycles) / 4 + hook_s / 0.01)
    assert row["ab_band"] == pytest.approx(3.182 * statistics.stdev(cycles) / 2, rel=1e-3)  # Student-t, 3 dof
    assert row.get("slowdown") is None  # half its steps take no checkpoint: no baseline comparison
    (target,) = report.targets([row])
    assert report.verdict(target) == verdict
    assert "autockpt's meter saw +0.4% in the same blocks" in target["measured"]
    assert report.table_rows([row])[0][4].startswith("A/B ")
    assert row["interval_steps"] == 7 and report.table_rows([row])[0][5] == "7 steps"  # not the gaps across off blocks


def test_a_failed_or_skipped_method_is_a_row_that_says_so() -> None:
    runs = [{"framework": "keras", "workload": "small", "method": {"name": "none"}, "rep": 0, "train": _train(0.1, []), "restore": None},
            {"framework": "keras", "workload": "small", "method": {"name": "orbax", "every": 5}, "rep": 0,
             "train": {"skipped": "orbax-checkpoint is not installed"}, "restore": None}]
    rows = report.summarize(runs)
    assert rows[1]["skipped"] == "orbax-checkpoint is not installed"
    assert "skipped: orbax-checkpoint is not installed" in report.table_rows(rows)[1][3]


def test_compare_command_on_stand_in_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "cmp"
    args = _args("--quick", "--workloads", "small", "--methods", "autockpt,modelcheckpoint,modelcheckpoint-h5",
                 "--repeats", "2", "--out", str(out))
    assert cli_compare.run(args, workers=FAKE) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 * 2 * 3  # repetitions × frameworks × (none, autockpt, native)
    assert all("error" not in r["train"] for r in results["runs"])
    restored = [r for r in results["runs"] if r["restore"]]
    assert restored and all(r["restore"]["restore_s"] > 0 for r in restored)
    md = (out / "results.md").read_text()
    assert "PyTorch / Lightning" in md and "TensorFlow / Keras" in md and "Targets" in md
    for png in ("slowdown_vs_interval.png", "blocked_vs_size.png", "size_per_format.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not (out / "runs").exists()  # scratch removed when every run succeeded
    rows = {(r["framework"], r["method"]): r for r in results["rows"]}
    assert rows[("lightning", "autockpt")]["exact"] is True and rows[("keras", "modelcheckpoint-h5")]["exact"] is False
    assert rows[("lightning", "autockpt")]["blocked_vs_native_sync"] < 0.2


def test_compare_runs_each_budgets_ab_at_the_interval_that_budget_run_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "cmp"
    args = _args("--quick", "--frameworks", "keras", "--workloads", "small", "--methods", "autockpt-budget-2%",
                 "--ab-cycles", "2", "--no-plots", "--out", str(out))
    assert cli_compare.run(args, workers=FAKE) == 0
    results = json.loads((out / "results.json").read_text())
    assert [report.method_key(r["method"]) for r in results["runs"]] == ["none", "none-long", "autockpt-budget-2%",
                                                                          "autockpt-ab-2%"]
    ab = results["runs"][-1]
    assert ab["method"]["every"] == 7 and ab["method"]["block"] == 14  # the stand-in's budget interval, 2 per block
    assert ab["train"]["steps"] == 3 + 2 * 2 * 14 and ab["restore"] is None
    assert ab["train"]["checkpoint_steps"] == [7, 14, 35, 42]  # blocks 4-17 and 32-45 on
    (target,) = [t for t in results["targets"] if t["target"].startswith("in-process")]
    assert "every 7 steps, 2 cycles" in target["measured"]


def test_merge_combines_runs_taken_separately(tmp_path: Path) -> None:
    def part(workload: str, every: int) -> dict:
        runs = [{"framework": "keras", "workload": workload, "method": m, "rep": 0, "train": t, "restore": None}
                for m, t in (({"name": "none"}, _train(0.1, [])),
                             ({"name": "autockpt", "every": every}, _train(0.1, [0.01])),
                             ({"name": "modelcheckpoint-h5", "every": every}, _train(0.2, [0.5])))]
        settings = {"every": every, "steps": 3 * every, "warmup": 2, "threads": 1, "repeats": 1, "budget_window_s": 6}
        return {"machine": {"description": "test machine"}, "date": f"2026-11-2{every}", "command": f"autockpt compare --every {every}",
                "settings": settings, "wall_s": 1.0, "frameworks": ["keras"], "workloads": {workload: {
                    "description": workload, "params": 1, "state_bytes": 12}}, "runs": runs}

    for name, every in (("a", 5), ("b", 10)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(part("small" if name == "a" else "large", every)))
    out = tmp_path / "merged"
    args = _args("--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--no-plots")
    assert cli_compare.run(args) == 0
    merged = json.loads((out / "results.json").read_text())
    assert {r["workload"] for r in merged["rows"]} == {"small", "large"} and len(merged["targets"]) == 2
    md = (out / "results.md").read_text()
    assert "`autockpt compare --every 5`" in md and "`autockpt compare --every 10`" in md
    assert cli.main(["compare", "--merge", str(tmp_path / "nowhere")]) == 2
