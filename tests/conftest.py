"""Shared pytest configuration."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # tests never open windows

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The tests use tiny tensors: extra threads only add synchronisation, which is costly on
    a loaded 2-core CI machine. Notebooks (nbval) run in their own kernels, unaffected."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
