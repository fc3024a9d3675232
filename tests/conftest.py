"""Shared pytest configuration."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # tests never open windows

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import SHARED_MULTI30K  # noqa: E402
from hypothesis import settings  # noqa: E402

if TYPE_CHECKING:
    from companion.data import Multi30kData

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


@pytest.fixture(scope="session")
def multi30k() -> Multi30kData:
    """Multi30k prepared once per test session from the shared local copy (never downloaded);
    the tests that use it are skipped when the copy is absent."""
    if not SHARED_MULTI30K.is_dir():
        pytest.skip(f"the shared Multi30k copy is not at {SHARED_MULTI30K}")
    from companion.data import prepare_multi30k

    return prepare_multi30k(SHARED_MULTI30K, progress=False)


@pytest.fixture(scope="session")
def train_pairs(multi30k: Multi30kData) -> list[tuple[str, str]]:
    """The raw ``(de, en)`` pairs of Multi30k's training split."""
    return multi30k.datasets["train"].pairs
