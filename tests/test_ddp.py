"""DistributedDataParallel on CPU: ``torchrun --nproc_per_node=2`` with the gloo backend gives
the same losses as one process training on the same global batches (both through
companion.train.train_step), and companion.distributed's parts in a one-process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from companion.configs import get_config
from companion.distributed import rank_and_world, whole_batch_loss
from companion.run import train

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
# dropout off: with dropout the two processes draw other masks than a single process would
SETTINGS = {"toy_examples": 400, "max_tokens": 600, "dropout": 0.0, "max_epochs": None}


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_two_processes_match_one(tmp_path):
    out = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
        "-m", "companion.run", "--config", "toy", "--out", str(out), "--device", "cpu",
        "--max-steps", str(STEPS), "--no-progress", "--no-eval",
        *[arg for k, v in SETTINGS.items() for arg in ("--set", f"{k}={v}")],
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[:2000] + "\n...\n" + done.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["steps"] == STEPS
    ddp = json.loads((out / "history.json").read_text())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train(
            get_config("toy", **SETTINGS),
            max_steps=STEPS,
            device="cpu",
            progress=False,
            evaluate=False,
        ).history
    finally:
        torch.set_num_threads(threads)

    # the same global batches: the same token counts; the same training: the same losses
    assert ddp["tokens"] == single.tokens
    assert ddp["lr"] == pytest.approx(single.lr)
    assert ddp["loss"] == pytest.approx(single.loss, rel=1e-4, abs=1e-5)
    assert ddp["val_loss"] == pytest.approx(single.val_loss, rel=1e-4, abs=1e-5)
    assert ddp["loss"][-1] < ddp["loss"][0]  # and it did train


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_whole_batch_loss_in_a_one_process_group(tmp_path):
    assert rank_and_world() == (0, 1)
    dist.init_process_group(
        backend="gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert rank_and_world() == (0, 1)
        loss = torch.tensor(2.5, requires_grad=True)
        weighted, batch_loss, batch_tokens = whole_batch_loss(loss, 7)
        # one process holds the whole batch: weight world * tokens / batch_tokens = 1
        assert (
            float(weighted.detach()) == 2.5 and float(batch_loss) == 2.5 and int(batch_tokens) == 7
        )
        assert not batch_loss.requires_grad
        weighted.backward()
        assert float(loss.grad) == 1.0
    finally:
        dist.destroy_process_group()
    assert rank_and_world() == (0, 1)
