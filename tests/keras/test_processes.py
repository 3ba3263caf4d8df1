"""autockpt_keras/processes.py: the one-process group, and the JAX gather's byte framing (texts
of different lengths, empty ones) over an all-gather between threads standing in for processes.
Two real JAX processes: test_keras_jax_distributed.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autockpt_keras.processes import JaxProcesses, Processes, processes_for
from tests.collectives import ThreadGather, on_threads


def jax_process(index: int, gather: ThreadGather) -> JaxProcesses:
    """A JaxProcesses whose process_allgather is ``gather`` (stacked, as JAX returns it)."""
    processes = JaxProcesses.__new__(JaxProcesses)
    processes.index, processes.count = index, gather.count
    processes._allgather = lambda array: np.stack(gather(index, np.asarray(array)))
    return processes


def test_one_process_gathers_its_own_and_agrees_with_itself() -> None:
    processes = processes_for("tensorflow")
    assert type(processes) is Processes and processes.writes
    assert processes.gather_text("héllo") == ["héllo"]
    agreed = processes.agree(save=True, signum=15)
    assert agreed.save and agreed.signum == 15 and agreed.failed_rank is None


@pytest.mark.parametrize("texts", [["a", "bcd", ""], ["", "", ""], ["ünïcode", "x" * 5000, "{}"]])
def test_jax_gather_text_returns_every_process_text_in_order(texts: list[str]) -> None:
    gather = ThreadGather(len(texts))
    results = on_threads(len(texts), lambda i: jax_process(i, gather).gather_text(texts[i]))
    assert results == [texts] * len(texts)


def test_jax_agreement_carries_process_0s_decision_and_any_signal_exactly() -> None:
    gather = ThreadGather(2)
    reports: list[dict[str, Any]] = [{"save": True}, {"signum": 10, "failed": True}]
    results = on_threads(2, lambda i: jax_process(i, gather).agree(**reports[i]))
    assert results[0] == results[1]
    assert results[0].save and results[0].signum == 10 and results[0].failed_rank == 1
    text = on_threads(2, lambda i: jax_process(i, gather).text_from(1, f"message {i}"))
    assert text == ["message 1", "message 1"]
