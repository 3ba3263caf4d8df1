"""Progress over a command's runs: plain lines off a terminal, with an estimate of what is left."""

from __future__ import annotations

import io

from rich.console import Console

from autockpt_bench.study.run_progress import RunProgress


def test_off_a_terminal_each_run_prints_one_line_with_an_estimate() -> None:
    out, now = io.StringIO(), [100.0]
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(console, 3, "goodput", clock=lambda: now[0]) as progress:
        progress.start("keras: native, every epoch")
        now[0] += 30.0
        progress.done()
        progress.start("keras: fixed every 85 steps")
        now[0] += 50.0
        progress.done()
        progress.start("keras: autockpt")
        progress.done()
    assert out.getvalue().splitlines() == [
        "run 1/3: keras: native, every epoch (elapsed 0s)",
        "run 2/3: keras: fixed every 85 steps (elapsed 30s, about 1m00s left)",
        "run 3/3: keras: autockpt (elapsed 1m20s, about 40s left)",
    ]


def test_on_a_terminal_a_bar_and_no_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RunProgress(console, 2, "compare") as progress:
        progress.start("rep 1 lightning small autockpt")
        progress.done()
    assert "run 1/2" not in out.getvalue() and progress.finished == 1


def test_a_run_skipped_leaves_the_count_and_the_estimate() -> None:
    out, now = io.StringIO(), [0.0]
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(console, 3, "compare", clock=lambda: now[0]) as progress:
        progress.skip()  # done by an earlier invocation
        progress.start("keras small none")
        now[0] += 10.0
        progress.done()
        progress.start("keras small autockpt")
        progress.done()
    assert out.getvalue().splitlines() == ["run 1/2: keras small none (elapsed 0s)",
                                           "run 2/2: keras small autockpt (elapsed 10s, about 10s left)"]
