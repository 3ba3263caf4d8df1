"""Lightning with ``dirpath="s3://..."`` and ``storage_options``, against a real S3-compatible
server (moto, a process on 127.0.0.1): a run that crashes mid-epoch is rerun and resumes from
the newest object (fetched with the options, since Lightning would open the URL without
them), ending bitwise equal to an uninterrupted run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt_core import read_manifest, storage_for
from autockpt_core.persist.storage import FsspecStorage
from autockpt_lightning import latest_checkpoint
from tests.fault.harness import assert_weights_equal
from tests.fault.lightning_script import train, weights_of
from tests.lightning.test_lightning_exact_resume import baseline, crash_at

torch.set_num_threads(1)
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_lightning_checkpoints_to_s3_and_a_rerun_resumes_bitwise(tmp_path: Path, s3_server: Any) -> None:
    url = s3_server.url(f"lightning-{uuid.uuid4().hex[:8]}")
    options = s3_server.storage_options
    common: dict[str, Any] = dict(val=True, epochs=2, every=3, storage=None, storage_options=options, root=str(tmp_path))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(url, model_cls=crash_at(17), **common)
    storage = storage_for(url, options)
    assert [r.step for r in read_manifest(storage)][-1] == 15
    assert latest_checkpoint(url, storage_options=options) == f"{url}/ckpt-step000000015.ckpt"

    model, _, cb = train(url, **common)
    assert cb is not None and cb.resumed_from == 15
    assert isinstance(cb.session.storage, FsspecStorage)  # type: ignore[union-attr]
    assert_weights_equal(weights_of(model), baseline(tmp_path))
    assert len(read_manifest(storage)) == 2  # keep_last=2, retention on the server too
