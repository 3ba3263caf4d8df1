"""``autockpt goodput``: seeded kill times shared with the simulator, the accounting of a
killed-and-rerun job, and the whole command on stand-in workers that are really SIGKILLed."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest

from autockpt_bench import cli
from autockpt_bench import goodput as cli_goodput
from autockpt_bench.study import goodput_report
from autockpt_bench.study.failures import history_seeds, kill_gaps
from autockpt_bench.study.kill_loop import Attempt, run_until_done
from autockpt_core.policy.simulate import Failures, Job, simulate

REPO = Path(__file__).resolve().parents[3]
FAKE = {"lightning": "tests.bench.fake_study_worker", "keras": "tests.bench.fake_study_worker"}


def test_kill_gaps_are_the_simulators_failure_history() -> None:
    gaps = list(itertools.islice(kill_gaps(10.0, seed=3), 5))
    assert gaps == list(itertools.islice(kill_gaps(10.0, seed=3), 5)) and len(set(gaps)) == 5
    # without checkpoints, a job of W seconds ends in the first gap longer than W (+ restart):
    work = sorted(gaps)[2] - 1e-6
    expected_kills = next(i for i, g in enumerate(gaps) if g > work)
    r = simulate([], Job(work_s=work, stall_s=0.0), Failures(10.0), jobs=1, seed=3)
    assert r.failures == expected_kills
    assert r.wall_s == pytest.approx(sum(gaps[:expected_kills]) + work)


@pytest.mark.parametrize(("mtbf", "after", "before"), [(20.0, 3.0, 14.0), (10.0, 4.0, 24.0), (2.0, 0.5, 1.5)])
def test_history_seeds_are_those_whose_first_kill_falls_in_the_job(mtbf: float, after: float, before: float) -> None:
    seeds = history_seeds(mtbf, 0, 5, after_s=after, before_s=before)
    assert len(seeds) == 5 and seeds == sorted(set(seeds))
    firsts = {seed: next(kill_gaps(mtbf, seed)) for seed in range(seeds[-1] + 1)}
    assert [seed for seed, gap in firsts.items() if after <= gap < before] == seeds  # none skipped wrongly


def test_history_seeds_name_the_fix_when_the_mtbf_dwarfs_the_job() -> None:
    with pytest.raises(ValueError, match="--mtbf 1e\\+06s.*below a few times --work"):
        history_seeds(1e6, 0, 3, after_s=3.0, before_s=14.0, max_tries=200)
    with pytest.raises(ValueError, match="ends before its startup"):
        history_seeds(10.0, 0, 1, after_s=5.0, before_s=5.0)


def _row(kind: str, wall: float, kills: float) -> dict:
    return {"name": kind, "kind": kind, "wall_s": wall, "finished": True, "kills": kills, "waste_s": wall - 10.0}


def test_a_comparison_without_a_failure_is_not_judged() -> None:
    """A history where a method met no kill says which process finished first, not what its
    checkpoints saved: no verdict, instead of a ratio or a negative percentage."""
    rows = [_row("every_epoch", 10.5, 0), _row("every_n", 12.0, 1), _row("autockpt", 16.0, 2)]
    measured = [t for t in cli_goodput.targets(rows) if t["basis"] == "measured"]
    by_target = {t["target"].split(" (")[0]: t for t in measured}
    assert by_target["waste ≥ 30% below per-epoch"]["met"] is None
    assert "no failure happened" in by_target["waste ≥ 30% below per-epoch"]["measured"]
    assert by_target["wall ≤ 1.05× best fixed"]["met"] is False  # both were killed: judged
    rows[1]["kills"] = 0
    assert all(t["met"] is None for t in cli_goodput.targets(rows) if t["basis"] == "measured")


def test_startup_is_paid_once_and_again_after_each_failure() -> None:
    job = Job(work_s=5.0, stall_s=0.0, restart_s=1.0, startup_s=1.0)
    r = simulate([], job, Failures(1e9), jobs=1, seed=0)
    assert r.wall_s == pytest.approx(6.0) and r.failures == 0


def test_account_counts_kills_redone_steps_and_restarts() -> None:
    attempts = [Attempt(0.0, 10.0, 10.0, True, -9), Attempt(10.0, 25.0, 30.0, False, 0)]
    events = [{"event": "start", "t": 0.1}, {"event": "resumed", "step": 0, "t": 2.0}]
    events += [{"event": "step", "step": s, "t": 2.0 + s * 0.1} for s in range(1, 60)]
    events += [{"event": "checkpoint", "step": 40, "t": 6.0, "blocked_s": 0.02}]
    events += [{"event": "start", "t": 10.1}, {"event": "resumed", "step": 40, "t": 13.0}]
    events += [{"event": "step", "step": s, "t": 13.0 + (s - 40) * 0.1} for s in range(41, 101)]
    events += [{"event": "done", "step": 100, "t": 24.9, "persist_s": 0.5}]
    acc = goodput_report.account(attempts, events, steps=100)
    assert (acc["kills"], acc["attempts"], acc["finished"], acc["wall_s"]) == (1, 2, True, 25.0)
    assert acc["steps_trained"] == 59 + 60 and acc["steps_redone"] == 19
    assert acc["restart_s"] == pytest.approx(2.5) and acc["checkpoint_steps"] == [40] and acc["blocked_ms"] == pytest.approx(20)
    pred = goodput_report.predict(acc, steps=100, step_s=0.1, startup_s=2.0, failure_free_s=12.0, mtbf_s=30.0, seed=0, jobs=500)
    assert pred["inputs"]["checkpoints"] == 1 and pred["inputs"]["persist_s"] == 0.5
    assert pred["expected"]["wall_s"] >= 10.0 + 2.5 and pred["replay"]["kills"] >= 0


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return cli.build_parser().parse_args(["goodput", *argv])


def test_settings_and_the_sweep() -> None:
    s = cli_goodput.settings_from_args(_args("--quick"))
    assert (s["mtbf_s"], s["work_s"], s["epochs"], s["workload"]) == (10.0, 20.0, 3, "small")
    assert cli_goodput.sweep_for(64, quick=False) == [4, 8, 16, 32]
    kinds = [cli_goodput.KINDS[m["name"]] for m in cli_goodput.plan_methods(cli_goodput.settings_from_args(_args()), 64)]
    assert kinds == ["every_epoch", "native_every_n", "every_n", "every_n", "every_n", "every_n", "autockpt", "autockpt_mtbf"]
    assert cli.main(["goodput", "--mtbf", "soon"]) == 2
    assert cli.main(["goodput", "--sweep", "0"]) == 2


def test_goodput_command_kills_real_processes_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "gp"
    args = _args("--quick", "--framework", "lightning", "--work", "1.2s", "--mtbf", "1.5s", "--seed", "1", "--out", str(out))
    assert cli_goodput.run(args, workers=FAKE) == 0
    result = json.loads((out / "goodput.json").read_text())
    assert {"framework", "mtbf_s", "failure_free_s", "methods"} <= set(result)
    assert result["framework"] == "lightning" and result["mtbf_s"] == 1.5
    methods = result["methods"]
    assert {m["kind"] for m in methods} == {"every_epoch", "every_n", "autockpt", "autockpt_mtbf"}
    for m in methods:
        assert {"name", "kind", "wall_s", "kills", "steps_redone", "restart_s"} <= set(m)
        assert m["finished"], m
        assert m["wall_s"] >= result["failure_free_s"] * 0.5
    assert sum(m["kills"] for m in methods) > 0  # the processes really were killed
    assert all(m["predicted"]["replay"]["wall_s"] > 0 for m in methods)
    assert (out / "goodput.png").read_bytes()[:4] == b"\x89PNG"
    assert "Kill times" in (out / "goodput.md").read_text()


def test_a_notice_before_each_kill_lets_the_method_that_acts_on_it_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "gp"
    args = _args("--quick", "--framework", "lightning", "--work", "1.2s", "--mtbf", "1.5s", "--seed", "1",
                 "--notice", "0.3s", "--methods", "every_epoch,autockpt", "--no-plots", "--out", str(out))
    assert cli_goodput.run(args, workers=FAKE) == 0
    result = json.loads((out / "goodput.json").read_text())
    by_kind = {m["kind"]: m for m in result["methods"]}
    assert result["settings"]["notice_s"] == 0.3 and all(m["finished"] for m in by_kind.values())
    assert by_kind["autockpt"]["kills"] > 0 and by_kind["every_epoch"]["kills"] > 0
    assert by_kind["autockpt"]["steps_redone"] == 0 < by_kind["every_epoch"]["steps_redone"]
    assert "each kill announced by SIGTERM 0.3 s before it" in (out / "goodput.md").read_text()


def test_the_kill_loop_sends_the_notice_and_starts_the_rerun_at_the_kill_time(tmp_path: Path) -> None:
    """A worker that exits 143 on SIGTERM: its failure is at the notice, its rerun at the kill time."""
    marker = tmp_path / "ran"
    code = ("import os, signal, sys, time\n"
            f"first = not os.path.exists({str(marker)!r})\n"
            f"open({str(marker)!r}, 'a').close()\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
            "time.sleep(5 if first else 0.05)\n")  # fmt: skip
    gaps = iter([1.0, 1e9])
    attempts, finished = run_until_done([sys.executable, "-c", code], dict(os.environ), gaps, tmp_path / "log",
                                        max_attempts=3, max_wall_s=60, notice_s=0.6)  # fmt: skip
    assert finished and len(attempts) == 2
    first, second = attempts
    assert first.noticed and first.killed and first.returncode == 143
    assert second.started >= first.started + 1.0 - 0.05  # not before the kill time
    assert not second.noticed and second.returncode == 0


def test_combine_takes_medians_over_failure_histories() -> None:
    seeds = [{"wall_s": w, "kills": k, "attempts": k + 1, "steps_redone": 3, "restart_s": 1.0, "checkpoints": 4,
              "blocked_ms": 2.0, "persist_s": None, "slowdown_factor": w / 10, "finished": f, "checkpoint_steps": [5]}
             for w, k, f in ((12.0, 1, True), (20.0, 3, True), (14.0, 2, False))]
    row = goodput_report.combine(seeds, failure_free_s=10.0)
    assert (row["wall_s"], row["kills"], row["wall_spread_s"], row["waste_s"]) == (14.0, 2, [12.0, 20.0], 4.0)
    assert row["finished"] is False and row["persist_s"] is None and len(row["seeds"]) == 3


def test_repeats_run_in_rounds_with_the_reference_between(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round: the failure-free reference, then every method with that round's history;
    the reference once more at the end. So the reference meets the machine the methods met."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    calls: list[str] = []
    run_method = cli_goodput._run_method

    def recorded(framework, workload, method, steps, settings, work, gaps, *rest, **named):  # type: ignore[no-untyped-def]
        calls.append(method["name"])
        return run_method(framework, workload, method, steps, settings, work, gaps, *rest, **named)

    monkeypatch.setattr(cli_goodput, "_run_method", recorded)
    out = tmp_path / "gp"
    args = _args("--quick", "--framework", "lightning", "--work", "0.8s", "--mtbf", "1.5s", "--methods",
                 "every_epoch,autockpt", "--repeats", "2", "--no-plots", "--out", str(out))
    assert cli_goodput.run(args, workers=FAKE) == 0
    methods = [n for n in calls[1:] if n != "none"]  # after the calibration run
    per_round = len(methods) // 2
    assert calls[1:] == ["none", *methods[:per_round], "none", *methods[per_round:], "none"]
    assert methods[:per_round] == methods[per_round:] and per_round == 2
    result = json.loads((out / "goodput.json").read_text())
    assert len(result["failure_free_runs_s"]) == 3
    seeds = result["history_seeds"]
    assert len(seeds) == 2 and seeds[0] == result["seed"]
    assert all([s["seed"] for s in m["seeds"]] == seeds for m in result["methods"])
    for seed in seeds:  # each history's first kill falls while the job trains
        assert next(kill_gaps(1.5, seed)) < result["failure_free_runs_s"][0]
