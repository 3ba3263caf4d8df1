import pytest

from autockpt_core import Profiler


def test_warmup_skipped_and_median_robust_to_outliers() -> None:
    p = Profiler(warmup_steps=3, window=10)
    for _ in range(3):
        p.record_iteration(100.0)  # warm-up: compilation
    for t in [0.1, 0.1, 0.1, 5.0, 0.1]:
        p.record_iteration(t)
    est = p.estimates()
    assert est.iter_time_s == pytest.approx(0.1)
    assert est.iterations_seen == 8
    assert not est.ready  # stall and persist not measured yet
    p.record_stall(0.01, 1000)
    p.record_persist(0.5)
    assert p.estimates().ready and p.estimates().checkpoint_bytes == 1000


@pytest.mark.parametrize(
    "giants, mean, counted",
    [
        (1, 0.12, 19),  # one stall during a persist: chance could put it there; left out
        (3, (17 * 0.12 + 3 * 0.5) / 20, 20),  # 3 of 20 loaded, none of 40 clean: the checkpoints'; capped
    ],
)
def test_loaded_iterations_leave_out_a_giant_until_giants_are_the_checkpoints(giants: int, mean: float,
                                                                              counted: int) -> None:
    p = Profiler(warmup_steps=0, window=50)
    for _ in range(40):
        p.record_iteration(0.1)
    for _ in range(20 - giants):
        p.record_iteration(0.12, loaded=True)
    for _ in range(giants):
        p.record_iteration(40.0, loaded=True)  # a page-cache flush or a machine's stall
    est = p.estimates()
    assert est.loaded_iter_time_s == pytest.approx(mean)  # capped at 5 x 0.1 where counted
    assert est.loaded_iterations == counted
    assert est.background_slowdown < 5  # uncapped it would read 6000%


def test_a_revised_iteration_is_judged_again() -> None:
    p = Profiler(warmup_steps=0, window=50)
    for _ in range(10):
        p.record_iteration(0.1)
    p.record_iteration(0.12, loaded=True)
    p.revise_last_iteration(9.0)  # the slowest rank's time: a stall
    assert p.giant_rates.loaded_giants == 1 and p.estimates().loaded_iter_time_s is None
    p.revise_last_iteration(0.12)
    assert p.giant_rates.loaded_giants == 0 and p.estimates().loaded_iter_time_s == pytest.approx(0.12)


def test_stale_clean_estimate_is_dropped_and_remeasured() -> None:
    p = Profiler(warmup_steps=0, window=5)
    for _ in range(5):
        p.record_iteration(0.5)  # noisy early estimate
    for _ in range(4):
        p.record_iteration(0.05, loaded=True)
    assert p.estimates().iter_time_s == pytest.approx(0.5)  # still fresh
    p.record_iteration(0.05, loaded=True)  # a whole window without a clean sample
    assert p.estimates().iter_time_s is None  # stale: policy pauses to re-measure
    p.record_iteration(0.04)
    p.record_iteration(0.04)
    assert p.estimates().iter_time_s is None
    p.record_iteration(0.04)
    assert p.estimates().iter_time_s == pytest.approx(0.04)


@pytest.mark.parametrize(("warmup", "window"), [(-1, 5), (0, 0)])
def test_rejects_bad_arguments(warmup, window) -> None:
    with pytest.raises(ValueError):
        Profiler(warmup, window)


def test_recent_iteration_time_follows_the_latest_clean_steps() -> None:
    p = Profiler(warmup_steps=0, window=50)
    assert p.estimates().recent_iter_time_s is None
    for _ in range(40):
        p.record_iteration(0.2)
    for _ in range(5):
        p.record_iteration(0.1)  # the process got faster (e.g. after its first checkpoint write)
    p.record_iteration(0.5, loaded=True)  # loaded steps do not count
    est = p.estimates()
    assert est.iter_time_s == pytest.approx(0.2)  # the window median lags
    assert est.recent_iter_time_s == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("steps", "sd"),
    [
        ([0.1] * 4, None),  # too few to tell
        ([0.1] * 20, 0.0),  # identical steps
        ([0.09, 0.11] * 10, 1.4826 * 0.01),  # ±10 ms around 100 ms
        ([0.09, 0.1, 0.11] * 7 + [5.0], 1.4826 * 0.01),  # one GC pause does not widen it
    ],
)
def test_the_spread_of_clean_steps_is_a_robust_standard_deviation(steps: list[float], sd: float | None) -> None:
    p = Profiler(warmup_steps=0, window=50)
    for s in steps:
        p.record_iteration(s)
    p.record_iteration(3.0, loaded=True)  # loaded steps do not count
    got = p.estimates().iter_sd_s
    assert got == (None if sd is None else pytest.approx(sd))


def test_a_reading_is_kept_until_the_next_measurement() -> None:
    p = Profiler(warmup_steps=0, window=10)
    for seconds in (0.1, 0.2, 0.3):
        p.record_iteration(seconds)
    first = p.estimates()
    assert p.estimates() is first  # nothing recorded since: the same reading
    changes = [
        lambda: p.record_iteration(0.4),
        lambda: p.record_iteration(0.5, loaded=True),
        lambda: p.revise_last_iteration(0.9),
        lambda: p.record_stall(0.05, 100),
        lambda: p.revise_last_stall(0.07),
        lambda: p.record_persist(1.0),
    ]
    readings = [first]
    for change in changes:
        change()
        reading = p.estimates()
        assert reading is not readings[-1] and reading != readings[-1]
        readings.append(reading)
    assert readings[-1].loaded_iter_time_s == 0.9 and readings[-1].stall_s == 0.07


def test_a_per_step_reading_is_kept_for_a_few_samples_once_ready_and_renewed_by_a_checkpoint() -> None:
    from autockpt_core.policy.profiler import STEP_READING_SAMPLES

    p = Profiler(warmup_steps=0, window=50)
    p.record_iteration(0.1)
    not_ready = p.step_reading()
    p.record_iteration(0.1)
    assert p.step_reading() is not not_ready  # not ready yet: every step reads afresh
    p.record_stall(0.01, 100)
    p.record_persist(0.5)
    kept = p.step_reading()
    assert kept.ready and kept.iter_time_s == pytest.approx(0.1)
    for _ in range(STEP_READING_SAMPLES // 2):  # a step records its iteration and its hook time
        p.record_iteration(0.3)
        p.record_hook(0.001)
        assert p.step_reading() is kept  # 8 slower steps: the decisions still use the kept reading
    exact = Profiler(warmup_steps=0, window=50)
    for seconds in (0.1, 0.1) + (0.3,) * 8:
        exact.record_iteration(seconds)
    assert exact.estimates().iter_time_s == pytest.approx(0.3)  # what an exact reading says by now
    p.record_iteration(0.3)  # one sample more
    renewed = p.step_reading()
    assert renewed is not kept and renewed.iter_time_s == pytest.approx(0.3)
    p.record_iteration(0.3)
    p.record_stall(0.02, 100)  # a checkpoint: renewed at once
    assert p.step_reading().checkpoints_seen == 2


def test_the_hook_time_is_a_median_without_the_warm_up() -> None:
    p = Profiler(warmup_steps=2, window=10)
    for hook in (0.5, 0.5, 0.001, 0.002, 0.09, 0.002):  # the first two in warm-up; one slow hook
        p.record_iteration(0.1)
        p.record_hook(hook)
    assert p.estimates().hook_s == pytest.approx(0.002)
    assert Profiler().estimates().hook_s is None
