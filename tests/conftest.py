"""Shared test settings: small thread counts (2-core CI machines), no GPU."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server process on 127.0.0.1 for the whole test session (tests/s3_server.py)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from tests.s3_server import S3Server

    server = S3Server().start()
    yield server
    server.stop()
