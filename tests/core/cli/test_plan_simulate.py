"""``autockpt plan`` and ``autockpt simulate`` through ``cli.main``."""

import json

import numpy as np
import pytest

from autockpt_core import Config, Estimates, IntervalRules, choose_interval
from autockpt_core.cli import main

PLAN = ["plan", "--iter-time", "350ms", "--stall", "120ms", "--persist", "2s", "--slowdown", "0%", "--mtbf", "6h",
        "--budget", "2%"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_has_the_decision_from_choose_interval(capsys) -> None:
    code, out, _ = run([*PLAN, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    expected = choose_interval(
        IntervalRules(budget=0.02, mtbf=6 * 3600),
        Estimates(iter_time_s=0.35, stall_s=0.12, persist_s=2.0, loaded_iter_time_s=0.35, loaded_iterations=1000,
                  loaded_sd_s=0.0),
    )
    assert data["chosen_interval_steps"] == expected.steps == 205
    assert data["chosen_interval_s"] == pytest.approx(expected.seconds)
    assert data["rule"] == "daly" and data["reason"] == expected.explain()
    assert set(data["policies"]) == {"budget", "persist", "young", "daly"}
    assert data["policies"]["budget"]["steps"] == 18 and data["front_loaded"] is None


def test_plan_without_a_measured_slowdown_counts_the_whole_persist_in_the_budget(capsys) -> None:
    argv = [a for a in PLAN if a not in ("--slowdown", "0%", "--mtbf", "6h")]
    code, out, _ = run([*argv, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    # (120 ms + 2 s) / (2% × 350 ms) = 303 steps: the budget approached from below
    assert data["policies"]["budget"]["steps"] == 303
    assert data["rule"] == "budget" and data["chosen_interval_steps"] == 303
    # with an MTBF, Daly at the measured 120 ms (205 steps): the budget holds there (120 ms / 205
    # steps of 350 ms = 0.17%), so the unmeasured slowdown does not push the interval out
    code, out, _ = run([*PLAN[:7], *PLAN[9:], "--json"], capsys)
    data = json.loads(out)
    assert data["policies"]["budget"]["steps"] == 18 and data["policies"]["daly"]["steps"] == 205
    assert data["rule"] == "daly" and data["chosen_interval_steps"] == 205
    code, out, _ = run([*PLAN[:-2], "--slowdown", "x", "--budget", "2%"], capsys)
    assert code != 0 and "--slowdown" in out + _


def test_plan_table_names_each_policy_and_the_choice(capsys) -> None:
    code, out, _ = run(PLAN, capsys)
    assert code == 0
    for word in ("budget", "persist", "young", "daly <- chosen", "chosen: 205 steps"):
        assert word in out


def test_plan_with_a_loss_curve_shows_the_front_loaded_schedule(tmp_path, capsys) -> None:
    k = np.arange(0, 100_000, 50)
    curve = tmp_path / "loss.csv"
    np.savetxt(curve, np.c_[k, 0.3 + 2 * np.exp(-5 * k / 100_000)], delimiter=",", header="step,loss", comments="")
    code, out, _ = run([*PLAN, "--loss-curve", str(curve), "--total-steps", "100000", "--json"], capsys)
    fl = json.loads(out)["front_loaded"]
    assert code == 0 and fl["active"]
    assert fl["first_interval_steps"] < 205 < fl["last_interval_steps"]
    flat = tmp_path / "flat.txt"
    flat.write_text("\n".join(["# loss"] + ["1.0"] * 200))
    code, out, _ = run([*PLAN, "--loss-curve", str(flat)], capsys)
    assert code == 0 and "front-loaded schedule: off" in out and "flat" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["plan", "--iter-time", "35xs", "--stall", "1s"], "--iter-time"),
        (["plan", "--iter-time", "1s", "--stall", "1s", "--budget", "200%"], "--budget"),
        (["plan", "--iter-time", "0s", "--stall", "1s"], "--iter-time must be positive"),
        (["plan", "--iter-time", "1s", "--stall", "1s", "--loss-curve", "/nonexistent"], "no such file"),
        (["simulate", "--iter-time", "1s", "--stall", "1s"], "required: --mtbf (see autockpt simulate --help)"),
        (["plan", "--stall", "1s"], "required: --iter-time"),
        (["inspect"], "required: dirpath"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(argv, words, capsys) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err and err.startswith("autockpt ")


def test_simulate_compares_policies_and_writes_a_png(tmp_path, capsys) -> None:
    png = tmp_path / "sim.png"
    argv = [
        "simulate", "--iter-time", "350ms", "--stall", "120ms", "--persist", "2s", "--slowdown", "0%",
        "--mtbf", "6h", "--work", "12h", "--jobs", "300", "--plot", str(png), "--json",
    ]
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r["policy"]: r for r in json.loads(out)["rows"]}
    assert {"every epoch", "every 1000 steps", "CheckFreq budget", "Young", "Daly", "front-loaded",
            "autockpt (daly)", "best uniform (brute force)"} == set(rows)
    assert rows["every epoch"]["waste_pct"] > rows["autockpt (daly)"]["waste_pct"]
    code, out, _ = run([a for a in argv if a != "--json"], capsys)
    assert code == 0 and "CheckFreq budget" in out and "plot written" in out


def test_plan_through_the_console_names_the_figures_each_rule_used_and_rounds_json() -> None:
    from tests.console import autockpt

    table = autockpt("plan", "--iter-time", "350ms", "--stall", "120ms", "--persist", "2s", "--mtbf", "6h")
    assert table.returncode == 0, table.stderr
    assert "Young: sqrt(2 * 120ms * MTBF 6.0h)" in table.stdout
    assert "overhead budget: 120ms per checkpoint" in table.stdout
    raw = autockpt("plan", "--iter-time", "350ms", "--stall", "120ms", "--persist", "2s", "--json")
    assert raw.returncode == 0, raw.stderr
    assert "0.35000000000000003" not in raw.stdout and '"iter_time_s": 0.35,' in raw.stdout
    data = json.loads(raw.stdout)
    assert data["cost_per_checkpoint_s"] == 2.12  # stall + the whole persist until a slowdown is measured
    assert data["policies"]["budget"]["what"].startswith("overhead budget: 2.1s per checkpoint")
