"""The resume point: where a checkpoint sits in ``fit()``'s timeline, stored in its file.

A :class:`ResumePoint` is written as JSON under the ``resume`` key of the checkpoint's
safetensors header (:mod:`autockpt_keras.checkpoint_file`) and read back when a rerun
resumes. :data:`POINT_VERSION` versions that JSON: a file written by an older autockpt with
the same version still loads. Its fields are explained with :class:`ResumePoint` and
:class:`~autockpt_keras.data_stream.DataStream` (what a "stream" is).

Call order and threading: built by :class:`~autockpt_keras.exact_resume.ExactResume` on the
training thread at the moment of a checkpoint; serialized by the snapshot; parsed when the
checkpoint file is read.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: Version of the JSON written under the ``resume`` key of the checkpoint header.
POINT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a checkpoint sits in the training timeline, and the generators at that moment.

    ``epoch``: the epoch ``fit()`` resumes at; ``batches_done``: batches of it already trained
    (the resumed epoch skips them; 0 = the epoch starts fresh). ``iterators_before``:
    tf.data iterators created before the current stream's (see
    :class:`~autockpt_keras.data_stream.DataStream`); ``stream_pos``: batches drawn from the
    current stream. ``rng_stream``: the global generators when the current iterator was
    created; ``rng_first_draw``: when its first batch was drawn, if other code ran in between
    (an iterator Keras created right after the previous epoch's last batch and first drew from
    after validation), else None; ``rng_step``: at the checkpoint. ``problems``: why a resume
    from here may not be exact (empty: exact).
    """

    epoch: int
    batches_done: int
    iterators_before: int
    stream_pos: int
    rng_stream: dict[str, Any] = dataclasses.field(repr=False)  # generator states: pages of numbers
    rng_step: dict[str, Any] = dataclasses.field(repr=False)
    rng_first_draw: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    steps_per_execution: int = 1
    inputs: str = "unknown"
    problems: tuple[str, ...] = ()

    @property
    def drop(self) -> int:
        """Batches of the stream drawn before this epoch (same stream, earlier epochs)."""
        return max(0, self.stream_pos - self.batches_done)

    def to_json(self) -> str:
        # Shallow: json.dumps walks the generators' states itself; dataclasses.asdict would
        # deep-copy their ~28,000 numbers first, in the hook that blocks training.
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data["problems"] = list(self.problems)
        data["version"] = POINT_VERSION
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ResumePoint":
        data = json.loads(text)
        version = data.pop("version", None)
        if version != POINT_VERSION:
            raise ValueError(f"unsupported resume point version {version!r}")
        data["problems"] = tuple(data.get("problems", ()))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
