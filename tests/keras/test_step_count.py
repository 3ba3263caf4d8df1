"""StepCount: the Keras step counted on the host between reads of the optimizer's iterations."""

from __future__ import annotations

import pytest

from autockpt_keras.step_count import StepCount, planned_end_step


class Iterations:
    """A fake ``optimizer.iterations`` whose reads are counted."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.value


@pytest.mark.parametrize(
    ("iterations", "floor", "batches", "expected"),
    [
        (0, None, [0, 1, 2], [1, 2, 3]),  # one step per batch
        (7, None, [0, 1], [8, 9]),  # a model trained before this fit
        (0, None, [2, 5, 7], [3, 6, 8]),  # steps_per_execution=3; the last call trains 2 batches
        (17, 20, [0, 1], [21, 22]),  # resumed: the checkpoint's step is above iterations
        (25, 20, [0], [26]),  # iterations above the checkpoint's step: the higher one
    ],
)
def test_trained_batches_count_from_the_start(
    iterations: int, floor: int | None, batches: list[int], expected: list[int]
) -> None:
    read = Iterations(iterations)
    count = StepCount(read)
    assert count.read_at(floor) == max(iterations, floor or 0)
    assert [count.trained(b) for b in batches] == expected
    assert read.reads == 1


def test_drawn_batches_of_a_resume_are_not_counted() -> None:
    count = StepCount(Iterations(18))
    count.read_at(18)
    for batch in range(8):  # batches 0..7 of the resumed epoch were trained before the crash
        count.skipped(batch)
    assert count.trained(8) == 19
    assert count.step == 19


@pytest.mark.parametrize(
    ("iterations_at_epoch", "expected"),
    [
        (10, 10),  # in step with the count
        (7, 10),  # the optimizer skipped 3 steps: the count does not go back
        (20, 20),  # two optimizer steps per batch (a custom train_step): moves up
    ],
)
def test_each_epoch_start_reads_again_and_never_goes_back(iterations_at_epoch: int, expected: int) -> None:
    read = Iterations(0)
    count = StepCount(read)
    count.read_at()
    count.epoch_begin()
    for batch in range(10):
        count.trained(batch)
    read.value = iterations_at_epoch
    assert count.epoch_begin() == expected
    assert count.trained(0) == expected + 1  # batch indices restart at each epoch
    assert read.reads == 3


@pytest.mark.parametrize(
    ("step", "epoch", "epochs", "per_epoch", "expected"),
    [
        (0, 0, 3, 10, 30),
        (20, 2, 4, 10, 40),  # resumed at epoch 2
        (18, 1, 4, 10, 48),  # resumed mid-epoch: 8 batches too many, the end rule acts later
        (0, 0, 3, None, None),  # a dataset of unknown length, first epoch
        (30, 3, 3, 10, None),  # no epoch left
        (0, 0, None, 10, None),
    ],
)
def test_the_planned_end(step: int, epoch: int, epochs: int | None, per_epoch: int | None, expected: int | None) -> None:
    assert planned_end_step(step, epoch, epochs, per_epoch) == expected
