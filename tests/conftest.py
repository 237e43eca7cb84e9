import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # tolerances.py
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))  # this checkout's seqmix, even in a git worktree


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="the device of the contract suite's mixers and inputs (seqmix.contract.use_device): cpu, cuda, ...")


def pytest_configure(config):
    from seqmix import contract

    contract.use_device(config.getoption("--device"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # pytest -n N (make test): the cores shared out, so N workers never run more threads than cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """SEQMIX_CACHE in the test's tmp_path: generated data and token files never touch the
    user's cache (files that need it: ``pytestmark = pytest.mark.usefixtures("private_cache")``)."""
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path / "cache"))
