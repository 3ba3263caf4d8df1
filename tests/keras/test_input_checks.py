"""Which backends draw a Python input's batches ahead of training (``loads_ahead``)."""

from __future__ import annotations

import pytest

from autockpt_keras import input_checks


@pytest.mark.parametrize(
    ("backend", "keras", "device", "ahead"),
    [
        ("tensorflow", (3, 10), "cpu", True),  # tf.data's prefetch thread
        ("torch", (3, 10), "gpu", False),
        ("jax", (3, 14), "cpu", True),  # Keras' JAX iterator fetched one batch ahead everywhere
        ("jax", (3, 15), "cpu", False),  # from 3.15 on, not on the CPU
        ("jax", (3, 15), "gpu", True),
        ("jax", (4, 0), "tpu", True),
    ],
)
def test_loads_ahead(monkeypatch: pytest.MonkeyPatch, backend: str, keras: tuple[int, int], device: str, ahead: bool) -> None:
    monkeypatch.setattr(input_checks, "keras_release", lambda: keras)
    monkeypatch.setattr(input_checks, "jax_backend", lambda: device)
    assert input_checks.loads_ahead(backend) is ahead


def test_the_installed_keras_release_is_read_without_importing_it() -> None:
    major, minor = input_checks.keras_release()
    assert major >= 3 and minor >= 0
