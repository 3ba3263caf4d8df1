import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from safetensors import safe_open
from safetensors.numpy import load, load_file

from autockpt_core.persist.tensorfile import read_tensor_file, write_tensor_file

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="abcdefgh/._", min_size=1, max_size=12),
        st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))),
        max_size=5,
    )
)
def test_round_trip_and_safetensors_interop(arrays) -> None:
    buf = io.BytesIO()
    n = write_tensor_file(buf, arrays, {"step": "7"})
    data = buf.getvalue()
    assert n == len(data)
    ours, meta = read_tensor_file(data)
    theirs = load(data)
    assert meta == {"step": "7"}
    assert set(ours) == set(theirs) == set(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(ours[k], v)
        np.testing.assert_array_equal(theirs[k], v)
        assert theirs[k].dtype == v.dtype and theirs[k].shape == v.shape


def test_metadata_visible_to_safe_open(tmp_path) -> None:
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        write_tensor_file(f, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"epoch": "3"})
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"epoch": "3"}
    np.testing.assert_array_equal(load_file(str(path))["w"], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_rejects_non_contiguous_and_truncated() -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        write_tensor_file(io.BytesIO(), {"t": np.ones((4, 4))[:, ::2]})
    buf = io.BytesIO()
    write_tensor_file(buf, {"t": np.ones(100)})
    with pytest.raises(ValueError, match="truncated"):
        read_tensor_file(buf.getvalue()[:-10])
