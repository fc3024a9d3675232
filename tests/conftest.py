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


@pytest.fixture
def tiny_config():
    """A small, fast configuration: the toy copy task with little data and small batches."""
    from companion.configs import get_config

    return get_config("toy", toy_examples=300, max_tokens=400, dropout=0.1, max_epochs=None)


@pytest.fixture
def make_trainer(tiny_config):
    """``make_trainer(config=tiny_config, out_dir=None, seed=0)`` → a fresh
    :class:`~companion.trainer.Trainer` on the toy task (``seed`` fixes the initial weights)."""
    from companion.run import build_model, prepare_data
    from companion.trainer import Trainer

    def make(config=None, out_dir=None, seed: int = 0):
        config = tiny_config if config is None else config
        data = prepare_data(config)
        torch.manual_seed(seed)
        model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
        torch.manual_seed(seed + 1)
        return Trainer(
            model=model,
            config=config,
            train_data=data.train,
            val_data=data.val,
            src_vocab=data.src_vocab,
            tgt_vocab=data.tgt_vocab,
            tokenizer=data.tokenizer,
            out_dir=out_dir,
            progress=False,
        )

    return make
