"""companion.trainer's loop (with companion.history): the learning-rate schedule, the
history, limits (steps, time budget, epochs) and exact resumption from a checkpoint.
DistributedDataParallel is tested in test_ddp.py."""

from __future__ import annotations

import json
import time

import pytest
import torch

from companion.history import History
from companion.model import TransformerConfig
from companion.run import build_model, prepare_data
from companion.train import inverse_sqrt_warmup
from companion.trainer import Trainer

# ------------------------------------------------------------------------- schedule, history


def test_learning_rate_follows_the_schedule(make_trainer, tiny_config):
    trainer = make_trainer()
    trainer.fit(max_steps=6)
    schedule = inverse_sqrt_warmup(
        tiny_config.model.d_model, tiny_config.warmup_steps, tiny_config.lr_factor
    )
    assert trainer.history.lr == pytest.approx([schedule(n) for n in range(1, 7)])
    assert trainer.history.step == list(range(1, 7))
    # warm-up rises linearly, then decays as 1/sqrt(step)
    assert schedule(20) == pytest.approx(schedule(10) * 2)
    assert schedule(4 * tiny_config.warmup_steps) == pytest.approx(
        schedule(tiny_config.warmup_steps) / 2
    )
    assert all(t > 0 for t in trainer.history.tokens)
    assert trainer.history.time == sorted(trainer.history.time)
    # stopped mid-epoch: one validation at the last step
    assert trainer.history.val_step == [6] and 0 < trainer.history.val_epoch[0] < 1
    assert trainer.history.val_epoch[0] == trainer.epochs_done


def test_history_round_trip(make_trainer, tmp_path):
    trainer = make_trainer()
    trainer.fit(max_steps=3)
    path = trainer.history.save_json(tmp_path / "history.json")
    again = History.load_json(path)
    assert again == trainer.history
    assert set(json.loads(path.read_text())) >= {"step", "loss", "lr", "tokens", "val_loss"}


def test_fit_needs_a_limit_and_checks_it(make_trainer, tiny_config):
    trainer = make_trainer(tiny_config.replace(max_epochs=None))
    with pytest.raises(ValueError, match="fit needs a limit"):
        trainer.fit()
    with pytest.raises(
        ValueError, match=r"time_budget must be a positive number of seconds, got 0"
    ):
        trainer.fit(time_budget=0)
    with pytest.raises(ValueError, match=r"max_steps must be >= 1, got -1"):
        trainer.fit(max_steps=-1)


def test_trainer_rejects_a_model_without_padding_id(tiny_config):
    data = prepare_data(tiny_config)
    model = build_model(tiny_config, len(data.src_vocab), len(data.tgt_vocab))
    model_without_pad = type(model)(
        TransformerConfig(14, 14, d_model=16, num_heads=2, num_layers=1, d_ff=16)
    )
    with pytest.raises(ValueError, match="tgt_pad_id"):
        Trainer(model_without_pad, tiny_config, data.train)
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        Trainer(model, {"d_model": 64}, data.train)


# ------------------------------------------------------------------------- resuming


def test_resume_continues_exactly(make_trainer, tmp_path):
    """N steps straight == N/2 steps, save, load into fresh objects, N/2 more (dropout on, an
    epoch boundary in between): the same losses and the same weights, bit for bit."""
    steps = 14
    straight = make_trainer(seed=0)
    assert len(straight.epoch_batches(0)) < steps  # the run crosses an epoch boundary
    straight.fit(max_steps=steps)

    first = make_trainer(out_dir=tmp_path, seed=0)
    first.fit(max_steps=steps // 2)  # saves tmp_path/checkpoint.pt
    torch.manual_seed(1234)  # disturb the random state: the checkpoint must restore it
    second = make_trainer(out_dir=tmp_path, seed=99)  # other initial weights, fresh optimiser
    second.load_checkpoint()
    assert second.step == steps // 2
    second.fit(max_steps=steps)

    assert second.history.loss == straight.history.loss
    assert second.history.lr == straight.history.lr
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor), name


def test_resume_refuses_another_model(make_trainer, tiny_config, tmp_path):
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_steps=1)
    other = make_trainer(tiny_config.replace(d_model=32))
    with pytest.raises(ValueError, match="does not match this trainer's.*d_model"):
        other.load_checkpoint(tmp_path / "checkpoint.pt")


def test_resume_accepts_a_config_saved_before_a_field_existed(make_trainer, tmp_path):
    """A checkpoint written before ``TransformerConfig.num_kv_heads`` existed stores no such key;
    resuming fills in the default instead of refusing the model (a raw dict comparison fails)."""
    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_steps=1)
    state = trainer.state_dict()
    del state["model_config"]["num_kv_heads"]
    fresh = make_trainer(seed=1)
    fresh.load_state_dict(state)
    assert fresh.step == 1
    state["model_config"]["no_such_field"] = 1
    with pytest.raises(ValueError, match="model_config cannot be rebuilt.*no_such_field"):
        fresh.load_state_dict(state)


# ------------------------------------------------------------------------- budgets


def test_time_budget_is_respected(make_trainer, tiny_config):
    trainer = make_trainer(tiny_config.replace(toy_examples=2000))
    budget = 1.5
    start = time.perf_counter()
    trainer.fit(time_budget=budget)
    wall = time.perf_counter() - start
    assert trainer.stop_reason == "time_budget"
    slowest_step = max(b - a for a, b in zip(trainer.history.time, trainer.history.time[1:]))
    # the last step started before the budget ran out
    assert trainer.history.time[-1] - budget <= slowest_step + 0.5
    assert wall < budget + 5.0  # + one step, one validation pass


def test_max_epochs_validates_every_epoch(make_trainer, tmp_path):
    from companion.checkpoint import load_checkpoint

    trainer = make_trainer(out_dir=tmp_path)
    trainer.fit(max_epochs=2)
    per_epoch = len(trainer.epoch_batches(0))
    assert trainer.stop_reason == "max_epochs" and trainer.epoch == 2
    assert trainer.epochs_done == 2.0
    assert trainer.history.val_epoch == [1.0, 2.0]
    assert trainer.history.val_step[0] == per_epoch
    assert load_checkpoint(tmp_path / "checkpoint.pt")["progress"]["epoch"] == 2
