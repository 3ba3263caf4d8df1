import numpy as np
import pytest

from autockpt_core import CheckpointSession, CheckpointWriteError, Config, Snapshot, read_tensor_file, write_tensor_file
from tests.faults import FailingStorage


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_snapshot(state, clock, copy_seconds):
    def snapshot(pool):
        arrays = {}
        for k, v in state.items():
            buf = pool.get(k, v.shape, v.dtype)
            np.copyto(buf, v)
            arrays[k] = buf
        clock.t += copy_seconds
        return Snapshot(write=lambda f: write_tensor_file(f, arrays), nbytes=sum(a.nbytes for a in arrays.values()))

    return snapshot


def run(session, clock, state, steps, iter_time=0.1, copy_seconds=0.01, hook_s=None):
    saved = []
    session.start(0)
    for step in range(1, steps + 1):
        clock.t += iter_time
        state["w"] += 1.0
        decision = session.step_end(step, loss=1.0 / step)
        if decision.save:
            session.save(step, 0, make_snapshot(state, clock, copy_seconds))
            session.writer.wait()
            saved.append((step, decision))
        if hook_s is not None:
            session.hook_time(hook_s)
    return saved


def test_policy_spacing_matches_reported_interval(tmp_path) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=3, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)
    state = {"w": np.zeros((10, 10), np.float32)}
    saved = run(session, clock, state, 200)
    # stall 10 ms, iter 100 ms, budget 2% -> k = ceil(0.01 / 0.002) = 5
    assert saved[0][1].reason.startswith("profiling")
    steady = [s for s, d in saved[1:]]
    gaps = set(np.diff([saved[0][0]] + steady))
    assert gaps == {5}
    assert all(d.interval.steps == 5 and d.interval.rule == "budget" for _, d in saved[1:])
    summary = session.finish()
    assert summary.checkpoints == len(saved) and summary.newest_step == saved[-1][0]
    assert summary.overhead == pytest.approx(0.01 / (0.1 * 5 + 0.01), rel=0.2)
    assert "autockpt:" in summary.line() and "budget 2.00%" in summary.line()
    newest = session.records()[-1]
    arrays, _ = read_tensor_file((tmp_path / newest.name).read_bytes())
    assert arrays["w"][0, 0] == saved[-1][0]  # the snapshot holds the state at that step
    assert session.buffers.allocations == 1  # reused across all checkpoints


def test_the_hooks_share_is_reported_beside_the_budget_which_stays_the_checkpoints(tmp_path, caplog) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=3, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)
    saved = run(session, clock, {"w": np.zeros((10, 10), np.float32)}, 200, hook_s=0.001)
    # hooks take 1 ms of each 100 ms step; the whole 2% stays the checkpoints': 10 ms stall -> k = 5
    assert {d.interval.steps for _, d in saved[1:]} == {5}
    assert session.estimates().hook_s == pytest.approx(0.001)
    with caplog.at_level("WARNING", logger="autockpt"):
        summary = session.finish()
    assert summary.overhead == pytest.approx(0.01 / (0.1 * 5), rel=0.1)  # the checkpoints' 2%
    assert summary.hooks == pytest.approx(0.01, rel=0.05) and summary.hook_us == pytest.approx(1000)
    assert "hooks 1000µs/step (1.00% of a step)" in summary.line()
    assert session.metrics()["autockpt/hook_pct"] == pytest.approx(1.0, rel=0.05)
    # 1% is over a tenth of the 2% budget: said once, at the end
    assert [r.getMessage() for r in caplog.records if "per-step work" in r.getMessage()] == [summary.hooks_warning()]


def test_every_n_steps_overrides_policy(tmp_path) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), every_n_steps=7, keep_last=100, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".st", clock=clock)
    saved = run(session, clock, {"w": np.zeros(3)}, 30)
    assert [s for s, _ in saved] == [7, 14, 21, 28]
    assert [r.step for r in session.records()] == [7, 14, 21, 28]


def test_resume_record_and_opt_out(tmp_path) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), every_n_steps=5, async_persist=False)
    s1 = CheckpointSession(cfg, framework="np", suffix=".st", clock=clock)
    run(s1, clock, {"w": np.zeros(3)}, 12)
    s1.finish()
    for config, framework, step in [(cfg, "np", 10), (cfg.replace(resume=False), "np", None), (cfg, "other", None)]:
        session = CheckpointSession(config, framework=framework, suffix=".st")
        record = session.resume_record()
        assert (record.step if record else None) == step
        session.finish()


def test_background_failure_surfaces_in_training_thread(tmp_path) -> None:
    clock = FakeClock()
    storage = FailingStorage(tmp_path, fail_after=10)
    cfg = Config(dirpath=str(tmp_path), every_n_steps=2)
    session = CheckpointSession(cfg, framework="np", suffix=".st", clock=clock, storage=storage)
    state = {"w": np.zeros(100)}
    session.start(0)
    clock.t += 0.1
    session.step_end(1)
    clock.t += 0.1
    assert session.step_end(2).save
    session.save(2, 0, make_snapshot(state, clock, 0.0))
    session.writer.wait()
    storage.armed = True
    clock.t += 0.1
    session.step_end(3)
    clock.t += 0.1
    assert session.step_end(4).save
    session.save(4, 0, make_snapshot(state, clock, 0.0))
    session.writer._thread.join()
    clock.t += 0.1
    with pytest.raises(CheckpointWriteError, match="step 4"):
        session.step_end(5)
    assert session.resume_record().step == 2
    session.finish()


def test_fresh_run_never_overwrites_or_retires_an_older_runs_checkpoints(tmp_path) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), every_n_steps=5, keep_last=3, async_persist=False)
    old = CheckpointSession(cfg, framework="np", suffix=".st", clock=clock)
    run(old, clock, {"w": np.zeros(3)}, 30)  # keeps 20, 25, 30
    old.finish()
    old_names = {r.name for r in old.records()}
    fresh = CheckpointSession(cfg.replace(resume=False, keep_last=2), framework="np", suffix=".st", clock=clock)
    run(fresh, clock, {"w": np.zeros(3)}, 15)  # steps 5, 10, 15: committed after the old run's
    fresh.finish()
    records = fresh.records()
    assert [r.step for r in records] == [20, 25, 30, 10, 15]  # commit order; retention dropped only its own 5
    assert {r.name for r in records[:3]} == old_names
    # the rerun resumes from the fresh run's newest, not the older run's higher step
    rerun = CheckpointSession(cfg, framework="np", suffix=".st")
    assert rerun.resume_record().step == 15
    rerun.finish()
    again = CheckpointSession(cfg.replace(resume=False, keep_last=10), framework="np", suffix=".st", clock=clock)
    run(again, clock, {"w": np.zeros(3)}, 10)
    again.finish()
    assert again.records()[-1].name == "ckpt-step000000010-v2.st"  # no overwrite of step 10's file


@pytest.mark.parametrize(
    "rank1_step_s, rank1_blocked_s, interval",
    [
        (None, None, 5),  # one rank: copy 10 ms, step 100 ms, budget 2% -> ceil(0.01 / 0.002)
        (0.1, 0.01, 5),  # a second rank as fast as rank 0 changes nothing
        (0.3, 0.01, 2),  # a 3x slower rank (rank 0 waits for it): ceil(0.01 / (0.02 * 0.3))
        (0.1, 0.05, 25),  # every rank held up 50 ms by a checkpoint: ceil(0.05 / 0.002)
        (0.3, 0.05, 9),  # both: ceil(0.05 / (0.02 * 0.3))
    ],
)
def test_combined_ranks_set_the_interval_for_the_slowest_rank(
    tmp_path, rank1_step_s: float | None, rank1_blocked_s: float | None, interval: int
) -> None:
    """Rank 0 computes 100 ms steps and copies 10 ms; it waits for rank 1 (at the gradient
    all-reduce, and after its copy at the checkpoint's last collective), so its clock runs at
    the slower pace. Each rank's StepClock figures reach the session through combine_ranks (the
    agreement's maxima); the blocked time one step after the checkpoint, as in the adapter.
    Without them rank 0's stall reads 10 ms, its first budget interval is 5 or 2 steps, and
    only the adaptive re-tuning (from wall time) later drifts to 28 or 10."""
    from autockpt_core.policy.rank_timing import RankTimes

    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=3, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)
    state = {"w": np.zeros((4, 4), np.float32)}
    step_s = max(0.1, rank1_step_s or 0.0)
    blocked_s = max(0.01, rank1_blocked_s or 0.0)
    session.start(0)
    saved_last_step = False
    decisions = []
    for step in range(1, 151):
        clock.t += step_s
        decision = session.step_end(step)
        if rank1_step_s is not None:
            blocked = saved_last_step
            own = RankTimes(step_s, blocked_s if blocked else 0.0)
            rank1 = RankTimes(rank1_step_s, rank1_blocked_s if blocked else 0.0)  # type: ignore[arg-type]
            session.combine_ranks(RankTimes.slowest([own, rank1]))
        saved_last_step = decision.save
        if decision.save:
            session.save(step, 0, make_snapshot(state, clock, 0.01))
            clock.t += blocked_s - 0.01  # rank 0 waits for the slower rank's part of the checkpoint
            decisions.append(decision)
    assert decisions[-1].interval.rule.endswith("budget") and decisions[-1].interval.steps == interval
    assert session.estimates().stall_s == pytest.approx(blocked_s)
    assert session.estimates().iter_time_s == pytest.approx(step_s)
    summary = session.finish()
    assert summary.mean_stall_s == pytest.approx(blocked_s, rel=0.05)


def test_closing_a_session_releases_its_host_buffers_and_the_summary_still_reports_them(tmp_path) -> None:
    import numpy as np

    from autockpt_core import CheckpointSession, Config, Snapshot, write_tensor_file

    session = CheckpointSession(Config(dirpath=str(tmp_path), every_n_steps=1, verbose=False), framework="np",
                                suffix=".safetensors")  # fmt: skip

    def snapshot(pool):  # type: ignore[no-untyped-def]
        buf = pool.get("w", (1000,), np.float32)
        buf[:] = 1.0
        return Snapshot(write=lambda f: write_tensor_file(f, {"w": buf}), nbytes=buf.nbytes)

    session.start(0)
    session.step_end(1)
    session.save(1, 0, snapshot)
    assert session.buffers.total_bytes == 4000
    summary = session.finish()
    assert session.buffers.total_bytes == 0 and len(session.buffers) == 0  # nothing held after fit()
    assert summary.buffer_bytes == 4000 and session.metrics()["autockpt/buffer_bytes"] == 4000.0


def test_the_overhead_reported_counts_the_slower_steps_after_a_checkpoint_not_only_the_stall(tmp_path) -> None:
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), every_n_steps=10, warmup_steps=0, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".st", clock=clock)
    state = {"w": np.zeros(3)}
    session.start(0)
    saved_at = None
    for step in range(1, 101):
        clock.t += 0.1 + (0.05 if saved_at == step - 1 else 0.0) + 0.001 * (step % 3)  # the step after one is slower
        if session.step_end(step).save:
            session.save(step, 0, make_snapshot(state, clock, 0.01))
            saved_at = step
    summary = session.finish()
    # 10 checkpoints: 10 × 10 ms blocked + 9 slower steps × 50 ms, over ~100 × 0.101 s of work
    assert summary.overhead == pytest.approx((10 * 0.01 + 9 * 0.05) / (100 * 0.101), rel=0.05)
    assert summary.overhead_band is not None and summary.overhead_band < 0.01
    assert session.measured_overhead().value == pytest.approx(summary.overhead)


def test_a_one_time_setup_in_a_snapshot_counts_in_the_overhead_not_in_the_stall(tmp_path) -> None:
    clock = FakeClock()
    session = CheckpointSession(Config(dirpath=str(tmp_path), warmup_steps=2), framework="np", suffix=".st", clock=clock)
    state = {"w": np.zeros(4, dtype=np.float32)}
    session.start(0)
    for step in range(1, 30):
        clock.t += 0.1
        if session.step_end(step).save:
            copy = make_snapshot(state, clock, 0.01)

            def first_traced(pool, copy=copy):  # the first checkpoint waits 2 s for a trace
                snap = copy(pool)
                if session.ledger.checkpoints == 0:
                    clock.t += 2.0
                    snap.setup_s = 2.0
                return snap

            first = session.ledger.checkpoints == 0
            assert session.save(step, 0, first_traced) == pytest.approx(2.01 if first else 0.01)
            session.writer.wait()
            assert session.estimates().stall_s == pytest.approx(0.01)  # what every checkpoint pays
    assert session.ledger.total_stall == pytest.approx(2.01 + 0.01 * (session.ledger.checkpoints - 1))
    assert session.measured_overhead().value > 2.0 / (29 * 0.1)  # the run paid it


def test_the_drain_of_a_device_s_queue_counts_neither_in_the_stall_nor_in_the_overhead(tmp_path) -> None:
    # A 2% budget on 3.2 ms steps: the host blocks 60 ms per checkpoint, 40 of them waiting for
    # the device to finish queued steps (hidden_s, read on the device's clock): the profiler and the
    # overhead see the 20 ms copy, and the interval follows it (20 ms / (2% * 3.2 ms) = 313 steps).
    # (The adaptive tuner's windows see it too where the steps refilling the queue overlap the
    # persist, as a GPU's do; this synchronous persist would make them look clean.)
    clock = FakeClock()
    session = CheckpointSession(Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=2, adaptive=False,
                                       async_persist=False), framework="np", suffix=".st", clock=clock)  # fmt: skip
    state = {"w": np.zeros(4, dtype=np.float32)}
    session.start(0)
    ahead = 0.0  # the queue the host refills after a drain: its next steps are 1 ms shorter
    for step in range(1, 2000):
        refill = min(ahead, 0.001)
        ahead -= refill
        clock.t += 0.0032 - refill
        if session.step_end(step).save:
            ahead = 0.040
            copy = make_snapshot(state, clock, 0.060)

            def drained(pool, copy=copy):
                snap = copy(pool)
                snap.hidden_s = 0.040
                return snap

            assert session.save(step, 0, drained) == pytest.approx(0.060)  # the host's blocked time
            session.writer.wait()
    assert session.estimates().stall_s == pytest.approx(0.020)
    assert session.ledger.total_stall == pytest.approx(0.020 * session.ledger.checkpoints)
    decision = session.step_end(2000)
    assert decision.interval is not None and 250 <= decision.interval.steps <= 420, decision.interval


def test_the_session_is_preparing_while_its_buffers_prefault_runs(tmp_path) -> None:
    import threading

    from autockpt_core import BufferPool

    release = threading.Event()

    def allocate(shape, dtype):
        release.wait()  # a large buffer being faulted in
        return np.empty(shape, dtype)

    cfg = Config(dirpath=str(tmp_path), async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", buffers=BufferPool(allocate))
    assert not session.preparing()
    session.buffers.prefault([("w", (4,), np.float32)])
    assert session.preparing()
    release.set()
    session.buffers.settle()
    assert not session.preparing()
    session.close()
