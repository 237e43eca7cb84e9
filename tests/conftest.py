import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # tolerances.py
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))  # this checkout's seqmix, even in a git worktree


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
