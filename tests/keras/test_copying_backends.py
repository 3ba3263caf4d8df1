"""autockpt_keras/copying.py per backend, in this process (TensorFlow backend): the TF copier
allocates nothing per checkpoint; the torch copier (fed torch tensors directly) and the JAX
copier (JAX is not installed: fakes with JAX's method names) copy into pooled buffers."""

from __future__ import annotations

import os
import threading
import types
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow")

from autockpt_core import BufferPool
from autockpt_keras.copying import (
    JaxCopier,
    TensorFlowCopier,
    TorchCopier,
    _cuda_to_host,
    buffer_pool_for,
    copier_for,
)
from autockpt_keras.state import StateEntry


class Holder:
    """Stands in for a keras.Variable: the copiers read ``.value``."""

    def __init__(self, value: Any) -> None:
        self.value = value


def rounds(copier: Any, entries: list[StateEntry], pool: BufferPool[Any], n: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for _ in range(n):
        pool.begin_round()
        out = copier(entries, pool)
        pool.end_round()
    return out


def test_tensorflow_copier_reuses_buffers_and_reads_the_variables_in_place() -> None:
    variables = [tf.Variable(tf.random.normal([64, 32])), tf.Variable(tf.zeros([7], tf.int64))]
    entries = [StateEntry(f"model/v{i}", "model", Holder(v)) for i, v in enumerate(variables)]
    pool: BufferPool[Any] = BufferPool()
    copier = TensorFlowCopier()
    first = rounds(copier, entries, pool, 1)
    variables[0].assign_add(tf.ones([64, 32]))
    again = rounds(copier, entries, pool, 20)
    assert pool.allocations == 2  # allocated once, reused by every later checkpoint
    assert all(again[k] is first[k] for k in first)
    np.testing.assert_array_equal(again["model/v0"], variables[0].numpy())
    # the batched read returns the variables' own buffers: np.copyto is the only copy
    read = copier._read(entries)
    assert read[0]._numpy().ctypes.data == variables[0].value()._numpy().ctypes.data


def test_torch_copier_copies_cpu_tensors_and_bfloat16_bits() -> None:
    torch = pytest.importorskip("torch")
    tensors = [torch.randn(5, 4), torch.randn(3).to(torch.bfloat16)]
    entries = [StateEntry(f"model/t{i}", "model", Holder(t)) for i, t in enumerate(tensors)]
    pool: BufferPool[Any] = BufferPool()
    out = rounds(TorchCopier(), entries, pool, 3)
    assert pool.allocations == 2
    np.testing.assert_array_equal(out["model/t0"], tensors[0].numpy())
    assert out["model/t1"].view(np.int16).tobytes() == tensors[1].view(torch.int16).numpy().tobytes()


def test_device_copies_fall_back_to_plain_copies_off_cuda() -> None:
    torch = pytest.importorskip("torch")
    dst, src = torch.empty(4), torch.arange(4.0)
    _cuda_to_host([(dst, src)])
    assert torch.equal(dst, src)


def test_jax_copier_syncs_the_state_and_starts_every_transfer_first() -> None:
    log: list[str] = []

    class FakeJaxArray:
        def __init__(self, name: str, value: np.ndarray) -> None:
            self.name, self.value = name, value

        def copy_to_host_async(self) -> None:
            log.append(f"start {self.name}")

        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            log.append(f"read {self.name}")
            return self.value

    class FakeModel:
        def jax_state_sync(self) -> None:
            log.append("sync")

    arrays = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones(4, np.float32)}
    entries = [StateEntry(f"model/{k}", "model", Holder(FakeJaxArray(k, v))) for k, v in arrays.items()]
    pool: BufferPool[Any] = BufferPool()
    out = rounds(JaxCopier(FakeModel()), entries, pool, 2)
    assert log[:5] == ["sync", "start a", "start b", "read a", "read b"]
    assert pool.allocations == 2
    np.testing.assert_array_equal(out["model/a"], arrays["a"])
    assert isinstance(copier_for("jax", FakeModel()), JaxCopier)


def test_pinned_pools_only_for_torch_on_cuda() -> None:
    assert buffer_pool_for("tensorflow") is None
    assert buffer_pool_for("jax") is None
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert buffer_pool_for("torch") is None


def test_the_first_batch_prepares_the_read_and_prefaults_buffers_the_first_copy_then_reuses() -> None:
    import keras

    from autockpt_keras.copying import warm_copier
    from autockpt_keras.snapshot import buffer_layout
    from autockpt_keras.state import collect_state

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 8), np.float32), np.ones((4, 2), np.float32), epochs=1, verbose=0)
    entries = collect_state(model)
    layout = buffer_layout(entries)
    assert [key for key, _, _ in layout] == [e.key for e in entries]
    assert all(shape == e.shape for (_, shape, _), e in zip(layout, entries))
    assert {dtype for _, _, dtype in layout} >= {np.dtype("float32")}
    pool: BufferPool[Any] = BufferPool()
    copier = TensorFlowCopier()
    traced_in: list[str] = []
    reader_for = copier._reader_for
    copier._reader_for = lambda e: (traced_in.append(threading.current_thread().name), reader_for(e))[1]  # type: ignore[method-assign]
    warm_copier(copier, entries)  # traces and runs the batched read in a helper thread; allocates nothing
    copier.settle()
    assert traced_in == ["autockpt-tf-read-warm"]
    assert pool.allocations == 0 and copier._reader is not None
    assert pool.prefault(layout)
    assert pool.settle() is None
    made = pool.allocations
    assert made == len(layout)
    copied = rounds(copier, entries, pool, 1)  # the first checkpoint copies into the prefaulted buffers
    assert pool.allocations == made
    np.testing.assert_array_equal(copied[entries[0].key], keras.ops.convert_to_numpy(entries[0].variable.value))
    assert traced_in == ["autockpt-tf-read-warm", threading.current_thread().name]  # the copy reuses the trace
    warm_copier(TorchCopier(), entries)  # copiers without a warm-up: nothing happens


def test_under_a_distribution_strategy_the_read_is_prepared_in_the_calling_thread() -> None:
    import keras

    from autockpt_keras.copying import warm_copier
    from autockpt_keras.state import collect_state

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 8), np.float32), np.ones((4, 2), np.float32), epochs=1, verbose=0)
    copier = TensorFlowCopier()
    with strategy.scope():  # as in fit(): the scope is this thread's
        warm_copier(copier, collect_state(model))
    assert copier._warming is None and copier._reader is not None


def test_a_snapshot_reports_the_wait_for_the_reads_preparation_as_one_time_setup() -> None:
    import keras

    from autockpt_keras.resume_point import ResumePoint
    from autockpt_keras.snapshot import StateSnapshot

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 8), np.float32), np.ones((4, 2), np.float32), epochs=1, verbose=0)
    copier = TensorFlowCopier()
    release = threading.Event()
    copier._warming = threading.Thread(target=release.wait)  # a trace still running
    copier._warming.start()
    threading.Timer(0.3, release.set).start()
    point = ResumePoint(epoch=1, batches_done=0, iterators_before=0, stream_pos=0, rng_stream={}, rng_step={})
    first = StateSnapshot(model, copier, "tensorflow", point, step=1, epoch=0, batch=0)(BufferPool())
    assert first.setup_s >= 0.25  # waited for the trace: the run paid it, later checkpoints do not
    second = StateSnapshot(model, copier, "tensorflow", point, step=2, epoch=0, batch=0)(BufferPool())
    assert second.setup_s < 0.05 and second.nbytes == first.nbytes


def test_the_device_probe_is_asked_of_a_torch_models_device_and_no_other_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from autockpt_keras.copying import device_busy_for

    on_cpu = [Holder(torch.zeros(2))]
    assert device_busy_for("tensorflow", type("M", (), {"variables": on_cpu})()) is None
    assert device_busy_for("torch", type("M", (), {"variables": on_cpu})()) is None
    assert device_busy_for("torch", type("M", (), {"variables": []})()) is None
    on_device = type("M", (), {"variables": [Holder(torch.empty(0, device="meta")), Holder(torch.zeros(1))]})()
    asked: list[object] = []
    monkeypatch.setattr("autockpt_torch.cuda_api.queue_busy_probe", lambda device: asked.append(device) or (lambda: True))
    assert device_busy_for("torch", on_device)() is True
    assert asked == [torch.device("meta")]  # the first variable's device decides


def test_the_copier_is_preparing_while_its_reads_trace_runs_and_not_after() -> None:
    from autockpt_keras.copying import copier_preparing

    copier = TensorFlowCopier()
    assert not copier_preparing(copier)  # nothing started
    release = threading.Event()
    copier._warming = threading.Thread(target=release.wait)  # a trace still running
    copier._warming.start()
    assert copier_preparing(copier)
    release.set()
    copier.settle()
    assert not copier_preparing(copier)
    assert not copier_preparing(TorchCopier()) and not copier_preparing(None)  # copiers without a warm-up


def test_the_host_clock_is_named_only_where_an_accelerator_has_no_probe(monkeypatch) -> None:
    import tensorflow as tf

    from autockpt_keras.copying import host_clock_note

    assert host_clock_note("tensorflow") is None  # this machine: the CPU alone
    assert host_clock_note("torch") is None  # the CUDA probe covers torch
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda: [types.SimpleNamespace(device_type=t) for t in ("CPU", "GPU")])  # fmt: skip
    assert host_clock_note("tensorflow") == (
        "costs read on the host's clock: no device probe for tensorflow on GPU, so a stall may include the "
        "device's queued steps")
