"""Fast snapshots, core side: write path (coalescing, parallel CRC, early writeback), pending
copies in the session, buffer metrics, bounded buffers over 1,000 checkpoints, the bench CLI."""

from __future__ import annotations

import io
import json
import os
import zlib
from typing import Any

import numpy as np
import pytest

from autockpt_core import (
    CheckpointSession,
    Config,
    ConfigError,
    LocalStorage,
    Snapshot,
    bench,
    cli,
    cli_bench,
    read_tensor_file,
)
from autockpt_core import storage as storage_mod
from autockpt_core.checksum import HashingWriter
from autockpt_core.tensorfile import write_tensor_file


class CountingRaw(io.RawIOBase):
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.calls.append(len(view))
        self.data += view
        return len(view)


def crc(data: bytes) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def test_small_writes_are_coalesced_and_large_ones_pass_through_in_order() -> None:
    raw = CountingRaw()
    writer = HashingWriter(raw, coalesce=64, parallel_min=1 << 40)
    parts = [b"a" * 10, b"b" * 20, b"c" * 100, b"d" * 5, b"e" * 70]
    for p in parts:
        writer.write(p)
    writer.flush()
    assert bytes(raw.data) == b"".join(parts)
    assert raw.calls == [30, 100, 5, 70]  # 10+20 gathered; 100 direct; 5 drained before the direct 70
    assert writer.size == sum(map(len, parts))
    assert writer.hexdigest() == crc(b"".join(parts))


def test_parallel_crc_matches_zlib_and_the_helper_stops_on_close() -> None:
    raw = CountingRaw()
    writer = HashingWriter(raw, parallel_min=16)
    payload = os.urandom(5000)
    writer.write(b"head")  # small: checksummed inline
    writer.write(payload)  # large: checksummed by the helper while written
    writer.write(memoryview(payload)[:100])
    helper = writer._helper
    assert helper is not None and helper._thread.is_alive()
    writer.close()
    helper._thread.join(timeout=5)
    assert not helper._thread.is_alive()
    writer.close()  # idempotent
    assert writer.hexdigest() == crc(b"head" + payload + payload[:100])


def test_a_failing_raw_write_still_waits_for_the_crc_helper() -> None:
    class Broken(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:  # type: ignore[override]
            raise OSError(28, "No space left on device")

    writer = HashingWriter(Broken(), parallel_min=16)
    with pytest.raises(OSError, match="No space"):
        writer.write(b"x" * 100)
    writer.close()


def test_local_storage_starts_writeback_in_chunks(tmp_path, monkeypatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(storage_mod, "WRITEBACK_CHUNK", 1000)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)), raising=False)
    payload = os.urandom(4500)
    result = LocalStorage(tmp_path).write_atomic("f.bin", lambda f: f.write(payload))
    assert (tmp_path / "f.bin").read_bytes() == payload
    assert result.size == 4500 and result.checksum == crc(payload)
    assert calls == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 1000)]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakePending:
    """Records the order of before_update/wait relative to the file write."""

    def __init__(self, log: list[str], clock: FakeClock, wait_s: float) -> None:
        self.log, self.clock, self.wait_s = log, clock, wait_s

    def before_update(self) -> None:
        self.log.append("before_update")
        self.clock.t += self.wait_s

    def wait(self) -> None:
        self.log.append("wait")


def test_pending_copy_orders_the_writer_and_counts_the_wait_as_stall(tmp_path) -> None:
    clock = FakeClock()
    log: list[str] = []
    cfg = Config(dirpath=str(tmp_path), every_n_steps=2, async_persist=False, warmup_steps=0)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)
    state = {"w": np.arange(6, dtype=np.float32)}

    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", (6,), np.float32)
        np.copyto(buf, state["w"])
        clock.t += 0.01

        def write(f: Any) -> int:
            log.append("write")
            return write_tensor_file(f, {"w": buf})

        return Snapshot(write=write, nbytes=24, pending=FakePending(log, clock, 0.03), mode="overlap")

    session.start(0)
    clock.t += 0.1
    assert session.step_end(1).save is False
    assert session.before_update() == 0.0  # nothing pending
    clock.t += 0.1
    assert session.step_end(2).save
    stall = session.save(2, 0, snapshot)
    assert log == ["wait", "write"]  # the writer waited for the copy before serializing
    assert stall == pytest.approx(0.01)
    assert session.estimates().stall_s is None  # recorded once the copy is waited for
    assert session.before_update() == pytest.approx(0.03)
    assert log == ["wait", "write", "before_update"]
    assert session.estimates().stall_s == pytest.approx(0.04)
    assert session.before_update() == 0.0  # only once
    summary = session.finish()
    assert summary.copy_mode == "overlap" and summary.buffer_peak_bytes == 24
    assert "(overlap copy)" in summary.line() and "host buffers 24B" in summary.line()
    metrics = session.metrics()
    assert metrics["autockpt/buffer_bytes"] == 24 and metrics["autockpt/buffer_peak_bytes"] == 24


def test_finish_waits_for_a_copy_still_pending(tmp_path) -> None:
    clock = FakeClock()
    log: list[str] = []
    session = CheckpointSession(Config(dirpath=str(tmp_path)), framework="np", suffix=".st", clock=clock)
    session.start(0)
    session.save(1, 0, lambda pool: Snapshot(write=lambda f: f.write(b"x"), nbytes=1, pending=FakePending(log, clock, 0.0)))
    session.finish()
    assert "before_update" in log and "wait" in log


def test_buffers_do_not_grow_over_1000_checkpoints() -> None:
    cfg = Config(dirpath="memory://autockpt-fast-snapshot-1000", every_n_steps=1, keep_last=1, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors")
    state = {"a": np.ones((32, 8), np.float32), "b": np.arange(5, dtype=np.int64)}

    def snapshot(pool: Any) -> Snapshot:
        arrays = {}
        for key, value in state.items():
            arrays[key] = pool.get(key, value.shape, value.dtype)
            np.copyto(arrays[key], value)
        return Snapshot(write=lambda f: write_tensor_file(f, arrays), nbytes=sum(a.nbytes for a in arrays.values()))

    session.start(0)
    for step in range(1, 1001):
        state["a"] += 1
        session.save(step, 0, snapshot)
    nbytes = sum(v.nbytes for v in state.values())
    assert session.buffers.allocations == 2
    assert session.buffers.total_bytes == session.buffers.peak_bytes == nbytes
    records = session.records()
    assert [r.step for r in records] == [1000]
    with session.storage.open_read(records[0].name) as f:
        arrays, _ = read_tensor_file(f.read())
    assert arrays["a"][0, 0] == 1001
    session.finish()


def test_config_snapshot_mode() -> None:
    assert Config(dirpath="x").snapshot_mode == "auto"
    assert Config(dirpath="x", snapshot_mode="overlap").snapshot_mode == "overlap"
    with pytest.raises(ConfigError, match="snapshot_mode"):
        Config(dirpath="x", snapshot_mode="fast")


def test_mlp_layout_and_result_lines() -> None:
    width, layers = bench.mlp_layout(100_000_000)
    assert layers == bench.LAYERS
    assert abs(3 * 4 * layers * width * width - 100_000_000) / 100_000_000 < 0.01
    assert bench.parse_result("noise\nBENCH-RESULT {\"a\": 1}\n") == {"a": 1}
    assert bench.parse_result("nothing") is None
    assert bench.peak_rss_bytes() > 0


def test_floors_measure_in_the_given_directory(tmp_path) -> None:
    assert bench.memcpy_floor(1 << 16, reps=3)["memcpy_s"] > 0
    assert bench.raw_write_floor(1 << 16, str(tmp_path), reps=1) > 0
    assert bench.safetensors_persist(1 << 16, str(tmp_path), reps=1)["safetensors_bytes"] > 1 << 16
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
    assert "test machine" in text and "| 100B | lightning | autockpt (copy on training thread) |" in text


def test_bench_is_a_cli_command(tmp_path, capsys) -> None:
    assert "bench" in cli.COMMANDS
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "--sizes" in capsys.readouterr().out
    assert cli.main(["bench", "--sizes", "0MB", "--dir", str(tmp_path)]) == 2


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


def test_map_tree_copies_long_scalar_runs_whole() -> None:
    import random

    from autockpt_core.tree import map_tree

    state = {"rng": random.getstate(), "ints": list(range(20)), "mixed": [np.zeros(2)] + list(range(10))}
    seen: list[str] = []
    out = map_tree(state, lambda x: isinstance(x, np.ndarray), lambda p, x: seen.append(p) or x + 1)
    assert out["rng"] == state["rng"] and out["ints"] == state["ints"] and out["ints"] is not state["ints"]
    assert seen == ["mixed/0"] and out["mixed"][0][0] == 1.0


def test_stall_is_summed_per_checkpoint_interval() -> None:
    marks = {s: float(s) for s in range(4, 25)}
    hooks = [(3.5, 9.0), (10.1, 0.5), (11.2, 0.1), (20.1, 0.2), (21.0, 0.1)]  # first: before warm-up ends
    out = bench.stall_figures(hooks, marks, warm=4, every=10)
    assert out["checkpoints"] == 2
    assert out["stall_first_s"] == pytest.approx(0.6) and out["stall_s"] == pytest.approx(0.45)
