"""``autockpt compare`` records each run in ``DIR/runs.jsonl`` as it finishes; the same command
again reuses the runs done and measures the rest. On stand-in workers (real processes, one per
run; ``fake_study_worker``, ``failing_study_worker``), and the log itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autockpt_bench import cli
from autockpt_bench import compare as cli_compare
from autockpt_bench.study import report
from autockpt_bench.study.run_log import RunLog

REPO = Path(__file__).resolve().parents[3]
FAKE = {"lightning": "tests.bench.fake_study_worker", "keras": "tests.bench.fake_study_worker"}
FAILING = {"lightning": "tests.bench.failing_study_worker", "keras": "tests.bench.failing_study_worker"}


def _args(out: Path, *argv: str):  # type: ignore[no-untyped-def]
    # the small workload (quick's default), no checkpointing, autockpt every 5 steps, ModelCheckpoint
    # to .weights.h5: three runs, two of them followed by a restore run
    return cli.build_parser().parse_args(["compare", "--quick", "--frameworks", "keras", "--methods",
                                          "autockpt,modelcheckpoint-h5", "--no-plots", "--out", str(out), *argv])


def _measured(monkeypatch: pytest.MonkeyPatch, interrupt_at: int | None = None) -> list[str]:
    """Record the method of every run the command measures (not the ones it reuses); with
    ``interrupt_at``, a Ctrl-C as that run (1-based) starts."""
    measured: list[str] = []
    measure = cli_compare._measure

    def counting(framework: str, workload: Any, method: dict[str, Any], rep: int, *rest: Any) -> dict[str, Any]:
        measured.append(f"{report.method_key(method)}-{rep}")
        if len(measured) == interrupt_at:
            raise KeyboardInterrupt
        return measure(framework, workload, method, rep, *rest)

    monkeypatch.setattr(cli_compare, "_measure", counting)
    return measured


def _log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_an_interrupted_compare_keeps_its_finished_runs_and_the_same_command_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = tmp_path / "cmp"
    measured = _measured(monkeypatch, interrupt_at=3)
    assert cli_compare.run(_args(out), workers=FAKE) == 130
    assert "interrupted: 2 run(s) of this command recorded in" in capsys.readouterr().out
    rows = _log(out)
    assert [report.method_key(r["run"]["method"]) for r in rows] == ["none", "autockpt"]
    assert not any(r["failed"] for r in rows) and rows[1]["run"]["restore"]["exact"] is True
    assert rows[1]["run"]["wall_s"] > 0 and rows[1]["id"]["steps"] == 17 and rows[1]["id"]["restore"] is True
    assert not (out / "results.json").exists()

    measured = _measured(monkeypatch)
    assert cli_compare.run(_args(out), workers=FAKE) == 0
    assert measured == ["modelcheckpoint-h5-0"]  # the two finished runs are reused
    results = json.loads((out / "results.json").read_text())
    assert [report.method_key(r["method"]) for r in results["runs"]] == ["none", "autockpt", "modelcheckpoint-h5"]
    assert results["reused_runs"] == 2 and results["run_s"] == pytest.approx(sum(r["wall_s"] for r in results["runs"]))
    assert len(_log(out)) == 3 and {r["method"] for r in results["rows"]} == {"none", "autockpt", "modelcheckpoint-h5"}
    assert "wall time" in capsys.readouterr().out.split("; 2 run(s) reused from runs.jsonl")[0][-20:]
    assert "2 run(s) reused from an earlier invocation" in (out / "results.md").read_text()

    measured = _measured(monkeypatch)  # one more repetition: the first one's runs are reused
    assert cli_compare.run(_args(out, "--repeats", "2"), workers=FAKE) == 0
    assert measured == ["none-1", "modelcheckpoint-h5-1", "autockpt-1"]  # odd repetitions in reverse
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 6

    measured = _measured(monkeypatch)  # another interval: another run; the log keeps the old rows
    assert cli_compare.run(_args(out, "--every", "4"), workers=FAKE) == 0
    assert measured == ["none-0", "autockpt-0", "modelcheckpoint-h5-0"]
    assert len(_log(out)) == 9

    measured = _measured(monkeypatch)  # --fresh: the log moves aside, every run is measured again
    assert cli_compare.run(_args(out, "--every", "4", "--fresh"), workers=FAKE) == 0
    assert measured == ["none-0", "autockpt-0", "modelcheckpoint-h5-0"]
    assert len(_log(out)) == 3 and len((out / "runs.old.jsonl").read_text().splitlines()) == 9


def test_a_failed_run_is_recorded_as_failed_and_measured_again_by_the_next_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("AUTOCKPT_TEST_FAIL", "modelcheckpoint-h5")
    out = tmp_path / "cmp"
    assert cli_compare.run(_args(out), workers=FAILING) == 0
    rows = _log(out)
    assert [r["failed"] for r in rows] == [False, False, True]
    assert "stand-in crash" in rows[2]["run"]["train"]["error"]
    (h5,) = [r for r in json.loads((out / "results.json").read_text())["rows"] if r["method"] == "modelcheckpoint-h5"]
    assert "stand-in crash" in h5["problems"][0]
    assert (out / "runs" / "keras-small-modelcheckpoint-h5-0" / "train.log").exists()  # its log stays for reading

    monkeypatch.delenv("AUTOCKPT_TEST_FAIL")
    measured = _measured(monkeypatch)
    assert cli_compare.run(_args(out), workers=FAILING) == 0
    assert measured == ["modelcheckpoint-h5-0"]
    results = json.loads((out / "results.json").read_text())
    assert not any("problems" in r for r in results["rows"]) and results["reused_runs"] == 2
    assert results["runs"][2]["restore"]["exact"] is False  # the stand-in's native resumes inexactly
    assert [r["failed"] for r in _log(out)] == [False, False, True, False]
    assert not (out / "runs").exists()  # every run succeeded: the scratch is gone


def _run(error: bool = False) -> dict[str, Any]:
    return {"framework": "keras", "method": {"name": "none"}, "rep": 0, "restore": None,
            "train": {"error": "exit status 1"} if error else {"step_s": 0.1}}


def test_the_log_cuts_a_torn_last_line_and_reuses_only_runs_that_did_not_fail(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    with RunLog(path) as log:
        log.append({"rep": 0}, _run())
        log.append({"rep": 1}, _run(error=True))
        assert log.reuse({"rep": 0}) == _run() and log.reuse({"rep": 1}) is None
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"id": {"rep": 2}, "failed": false, "ru')  # killed while writing this line
    with RunLog(path) as log:
        assert log.recorded == 1 and log.reuse({"rep": 2}) is None
        log.append({"rep": 2}, _run())
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [{"rep": 0}, {"rep": 1}, {"rep": 2}]
    with RunLog(path) as log:
        assert log.reuse({"rep": 2}) == _run() and log.reuse({"rep": 0, "steps": 17}) is None  # other settings
        reused = log.reuse({"rep": 0})
        assert reused is not None
        reused["train"]["step_s"] = 1.0  # a copy: the log's own record stays as written
        assert log.reuse({"rep": 0}) == _run()
    with RunLog(path, fresh=True) as log:
        assert log.recorded == 0 and log.reuse({"rep": 0}) is None
    assert path.read_text() == "" and len((tmp_path / "runs.old.jsonl").read_text().splitlines()) == 3
