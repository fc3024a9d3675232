"""Fault injection for a training run (issue 11): a run killed with SIGKILL at random points
and resumed leaves a loadable checkpoint and ends with the same losses and weights, bit for
bit, as a run that was never interrupted; a read-only or full output folder fails before
training starts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import companion._files
from companion.checkpoint import load_checkpoint
from companion.run import OutputFolderError, main, train

ROOT = Path(__file__).resolve().parents[1]

#: a tiny toy run: dropout on (the random state must resume too), 4 epochs of 6 batches,
#: a checkpoint after every epoch, no progress bars and no final evaluation
ARGS = ["--config", "toy", "--max-epochs", "4", "--threads", "1", "--no-progress", "--no-eval",
        "--set", "toy_examples=120", "--set", "max_tokens=300", "--set", "dropout=0.1"]  # fmt: skip

#: the child runs the command line, reporting on stdout when its imports are done, after
#: every step and before every checkpoint save, so that the test can kill it at chosen points
CHILD = """
import sys
import companion.trainer
from companion.run import main

Trainer = companion.trainer.Trainer
step, save = Trainer.train_step, Trainer.save_checkpoint

def train_step(self, *args, **kwargs):
    stats = step(self, *args, **kwargs)
    print("step", self.step + 1, flush=True)
    return stats

def save_checkpoint(self, *args, **kwargs):
    print("saving", self.step, flush=True)
    return save(self, *args, **kwargs)

Trainer.train_step, Trainer.save_checkpoint = train_step, save_checkpoint
print("ready", flush=True)
main(sys.argv[1:], prog="python -m companion.train")
"""
STEPS = 24  # 4 epochs of 6 batches


def start(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *ARGS, "--out", str(out), "--resume"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def kill_at(out: Path, event: str, value: int) -> dict:
    """Run (resuming) until the child reports ``event value`` (``step N``: just after step N;
    ``saving K``: the K-th checkpoint save of this process begins), SIGKILL it there; what
    the folder holds afterwards."""
    child, seen = start(out), 0
    for line in child.stdout:
        kind, _, number = line.strip().partition(" ")
        seen += kind == "saving"
        if (event == "step" and kind == "step" and int(number) >= value) or (
            event == "saving" and kind == "saving" and seen == value
        ):
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=60)
    checkpoint = out / "checkpoint.pt"
    return {
        "killed at": f"{event} {value}",
        "returncode": child.returncode,
        "checkpoint step": load_checkpoint(checkpoint)["progress"]["step"]  # loadable, intact
        if checkpoint.exists()
        else None,
        "temporary files": len(list(out.glob(".checkpoint.pt.*"))) if out.exists() else 0,
    }


#: seeds of the kill points (one by default, to keep the test short; e.g. FAULT_SEEDS=0,1,2)
SEEDS = [int(seed) for seed in os.environ.get("FAULT_SEEDS", "0").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_and_resumed_run_matches_an_uninterrupted_one(seed, tmp_path, capsys):
    main([*ARGS, "--out", str(tmp_path / "reference")])
    reference = load_checkpoint(tmp_path / "reference" / "checkpoint.pt")
    assert reference["progress"]["step"] == STEPS

    out, rng = tmp_path / "killed", random.Random(seed)
    kills = [kill_at(out, "step", rng.randint(1, 5))]  # before the first checkpoint
    kills.append(kill_at(out, "saving", rng.randint(1, 2)))  # while saving a checkpoint
    done = kills[-1]["checkpoint step"] or 0
    kills.append(kill_at(out, "step", rng.randint(done + 1, STEPS - 1)))  # anywhere later
    assert all(k["returncode"] == -signal.SIGKILL for k in kills)

    child = start(out)  # the last resume runs to the end
    output = child.communicate(timeout=300)[0]  # "step"/"saving" lines, then the results
    results = json.loads(output[output.index("\n{") + 1 :])
    assert child.returncode == 0
    final = load_checkpoint(out / "checkpoint.pt")
    with capsys.disabled():
        print(f"\nkill points (seed {seed}): {kills}; then {results['steps']} steps in all")
    assert final["progress"] == {**reference["progress"], "elapsed": final["progress"]["elapsed"]}
    assert final["history"]["loss"] == reference["history"]["loss"]  # bit for bit
    assert final["history"]["val_loss"] == reference["history"]["val_loss"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write in: a tmp folder without write permission, or (as
    root, which ignores permissions) a read-only system folder."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    target = folder / "run"
    if _writable(folder):  # root: permissions do not stop it; try a read-only system folder
        if not Path("/sys").is_dir() or _writable(Path("/sys")):
            pytest.skip("no read-only folder available to this user")
        target = Path("/sys/companion-run")
    yield target
    folder.chmod(0o755)


def _writable(folder: Path) -> bool:
    try:
        (folder / ".companion-probe").write_bytes(b"")
    except OSError:
        return False
    (folder / ".companion-probe").unlink()
    return True


def test_read_only_output_folder_fails_before_training(read_only_folder, monkeypatch, capsys):
    def no_training(*args, **kwargs):
        raise AssertionError("the data must not even be prepared")

    monkeypatch.setattr("companion.run.prepare_data", no_training)
    with pytest.raises(
        OutputFolderError, match=rf"^.*out_dir {read_only_folder} cannot be written"
    ):
        train("toy", out_dir=read_only_folder, max_steps=1)
    with pytest.raises(SystemExit) as exit_code:  # the command line: one line, no traceback
        main([*ARGS, "--out", str(read_only_folder)])
    assert exit_code.value.code == 1
    assert "error: [Errno" in capsys.readouterr().err


def test_output_folder_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OutputFolderError, match="cannot be written"):
        train("toy", out_dir=tmp_path / "file" / "run", max_steps=1)


def test_full_output_folder_fails_before_training(tmp_path, monkeypatch):
    """A disk without room for two checkpoints: the error comes before the first step."""
    usage = companion._files.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        companion._files.shutil, "disk_usage", lambda path: usage._replace(free=100_000)
    )
    monkeypatch.setattr("companion.trainer.Trainer.fit", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(OutputFolderError, match=r"has 0.1 MiB free, but the run needs about"):
        train("toy", out_dir=tmp_path / "run", max_steps=1)
