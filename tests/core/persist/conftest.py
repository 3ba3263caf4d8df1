import pytest

from tests.core.persist.holding import holding_processes


@pytest.fixture()
def holding(tmp_path):
    """``holding(mode="plain"|"fork")`` starts a process holding the lock on ``tmp_path``."""
    yield from holding_processes(tmp_path)
