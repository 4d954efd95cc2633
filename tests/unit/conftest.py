"""Unit-test settings shared by every module here."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run torch on one thread: the systems here are tiny, and on a busy 2-core
    machine two threads made them several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
