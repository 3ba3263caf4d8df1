"""One Keras case's job: the workload's data, the epochs that cover its steps, ``fit`` as every
case calls it (numpy arrays, ``shuffle=False``, ``verbose=0``) and the trained weights.

Used by :mod:`.keras_train`, :mod:`.keras_restore` and :mod:`.keras_goodput` inside a
:mod:`.keras_study` worker process, after :func:`.keras_study.setup_backend` (training thread).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..study.workloads import Workload, make_data


def weights_of(model: Any) -> list[Any]:
    import keras

    return [keras.ops.convert_to_numpy(v.value) for v in model.trainable_weights]


class Job:
    def __init__(self, workload: Workload, method: dict[str, Any], spec: dict[str, Any]) -> None:
        self.workload, self.method, self.spec = workload, method, spec
        self.name = method["name"]
        self.steps = int(spec["steps"])
        self.spe = workload.steps_per_epoch
        self.epochs = math.ceil(self.steps / self.spe)
        self.dir = Path(spec.get("dir") or ".")
        self.x, self.y = make_data(workload, self.spe)

    def fit(self, model: Any, callbacks: list[Any], initial_epoch: int = 0) -> None:
        model.fit(self.x, self.y, batch_size=self.workload.batch, shuffle=False, epochs=self.epochs,
                  initial_epoch=initial_epoch, verbose=0, callbacks=callbacks)

    def base(self) -> dict[str, Any]:
        return {"framework": "keras", "workload": self.workload.name, "method": self.name}
