"""autockpt_keras/checkpoint_file.py: every process's resume point in the header of a file
written by a multi-process job, and which point each process of a resumed job takes."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from autockpt_core import ResumeNotExactWarning
from autockpt_core.persist.tensorfile import write_tensor_file
from autockpt_keras.checkpoint_file import file_metadata, read_checkpoint_bytes
from autockpt_keras.resume_point import ResumePoint


def point(process: int) -> ResumePoint:
    return ResumePoint(
        epoch=1, batches_done=3, iterators_before=0, stream_pos=3,
        rng_stream={"numpy": [process]}, rng_step={"numpy": [process, 1]},
    )


def written(process_points: list[str] | None) -> bytes:
    meta = file_metadata(
        step=9, epoch=1, batch=2, next_epoch=1, backend="jax", keras_version="3", keys=["model/w"],
        resume=point(0), process_points=process_points,
    )
    buffer = io.BytesIO()
    write_tensor_file(buffer, {"model/w": np.arange(3, dtype=np.float32)}, meta)
    return buffer.getvalue()


def test_each_process_of_a_job_of_the_same_size_takes_its_own_point() -> None:
    _, info = read_checkpoint_bytes(written([point(i).to_json() for i in range(3)]), "f")
    assert info.process_points == (point(0), point(1), point(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [info.for_process(i, 3).resume for i in range(3)] == [point(0), point(1), point(2)]


@pytest.mark.parametrize("written_by, resumed_by", [(2, 3), (2, 1), (1, 2)])
def test_a_job_of_another_size_takes_process_0s_point_with_a_warning(written_by: int, resumed_by: int) -> None:
    points = [point(i).to_json() for i in range(written_by)] if written_by > 1 else None
    _, info = read_checkpoint_bytes(written(points), "f")
    with pytest.warns(ResumeNotExactWarning, match=f"job of {written_by} process.*this one has {resumed_by}"):
        assert info.for_process(resumed_by - 1, resumed_by).resume == point(0)


def test_a_one_process_file_resumed_by_one_process_is_unchanged_and_quiet() -> None:
    _, info = read_checkpoint_bytes(written(None), "f")
    assert info.process_points == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert info.for_process(0, 1) is info


def test_a_resume_point_with_real_generator_states_round_trips_through_its_json() -> None:
    import random

    states = {
        "python": list(random.Random(3).getstate()[1]),
        "numpy": np.random.default_rng(3).bit_generator.state,
        "nested": {"tuple": (1, 2), "list": [[0.5, None], "text"]},
    }
    original = ResumePoint(
        epoch=2, batches_done=5, iterators_before=1, stream_pos=5, rng_stream=states, rng_step=states,
        rng_first_draw=None, steps_per_execution=2, inputs="arrays", problems=("a", "b"),
    )
    text = original.to_json()
    parsed = ResumePoint.from_json(text)
    assert parsed.to_json() == text
    assert parsed.problems == ("a", "b") and parsed.rng_stream["python"] == states["python"]
    assert parsed.rng_stream["nested"] == {"tuple": [1, 2], "list": [[0.5, None], "text"]}  # JSON's lists


def test_the_repr_of_a_checkpoint_info_is_a_few_lines() -> None:
    """It printed every generator state (30,943 characters for the study's model): now the
    fields a reader looks for, with the arrays and the processes' points counted."""
    from autockpt_keras.checkpoint_file import CheckpointInfo

    big = ResumePoint(epoch=1, batches_done=3, iterators_before=0, stream_pos=3,
                      rng_stream={"numpy": list(range(5000))}, rng_step={"python": list(range(5000))})
    info = CheckpointInfo(path="ck/ckpt-step000000009.safetensors", step=9, epoch=1, batch=2, next_epoch=1,
                          backend="tensorflow", keras_version="3.15.0", keys=tuple(f"model/w{i}" for i in range(1200)),
                          resume=big, process_points=(big, big))
    text = repr(info)
    assert len(text) < 600, text
    assert "step=9" in text and "keys=<1200 arrays>" in text and "process_points=<2>" in text
    assert "batches_done=3" in text and "4999" not in text
