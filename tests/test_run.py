"""companion.run: whole runs (the toy task, the Multi30k pipeline end to end), the model of
a configuration and the command line (``python -m companion.run``, or ``python -m
companion.train``, the same command)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import companion.run
from companion.configs import get_config
from companion.data import PAD_ID
from companion.run import build_model, main, train

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_ROOT", ROOT.parent / "shared" / "data" / "multi30k"))

# ------------------------------------------------------------------------- whole runs


def test_toy_task_learns(tmp_path):
    """The toy configuration copies about 90% of unseen sequences exactly after 300 steps."""
    result = train("toy", tmp_path, max_steps=300, progress=False)
    assert result.results["test_accuracy"] >= 0.8, result.results
    assert result.history.val_loss[-1] < 0.25 * result.history.val_loss[0]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["steps"] == 300 and written["test_accuracy"] == result.results["test_accuracy"]


@pytest.mark.skipif(not (MULTI30K / "train.de.gz").is_file(), reason="no local Multi30k copy")
def test_multi30k_pipeline_end_to_end(tmp_path):
    from companion.metrics import Translator

    config = get_config(
        "cpu",
        d_model=32,
        num_heads=2,
        num_layers=1,
        d_ff=32,
        max_tokens=2000,
        beam_size=2,
        length_penalty_grid=(0.6, 1.5),
    )
    result = train(
        config, tmp_path, data_root=MULTI30K, download=False, max_steps=2, progress=False
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 2 and math.isfinite(results["val_loss"])
    assert 0 <= results["test_bleu"] <= 100 and 0 <= results["test_tokenized_bleu"] <= 100
    # α was chosen on the validation set: the first of the best validation scores
    by_alpha = results["val_bleu_by_length_penalty"]
    assert list(by_alpha) == ["0.6", "1.5"]
    assert results["length_penalty"] == float(max(by_alpha, key=by_alpha.__getitem__))
    assert len((tmp_path / "test_translations.txt").read_text().splitlines()) == 1000
    assert {p.name for p in tmp_path.iterdir()} >= {
        "checkpoint.pt",
        "history.json",
        "config.json",
        "results.json",
    }
    translator = Translator.from_checkpoint(tmp_path / "checkpoint.pt", beam_size=1)
    out = translator.translate(["Ein Hund läuft.", ""])
    assert len(out) == 2 and all(isinstance(s, str) for s in out) and out[1] == ""
    assert translator.tgt_vocab == result.data.tgt_vocab


# ------------------------------------------------------------------------- command line


def test_train_module_runs_the_same_command_line_without_importing_run():
    """``python -m companion.train`` is ``python -m companion.run`` (as README and chapter 8 say),
    while importing ``companion.train`` loads nothing above it (no cycle)."""
    done = subprocess.run(
        [sys.executable, "-m", "companion.train", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--config" in done.stdout and "--out" in done.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, companion.train; print('companion.run' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert probe.stdout.strip() == "False", (
        "importing companion.train must not import companion.run"
    )


@pytest.mark.parametrize("module", ["companion.run"])
def test_cli_help(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0
    for option in ("--config", "--out", "--time-budget", "--max-steps", "--data-root", "--set"):
        assert option in done.stdout
    assert done.stdout.startswith(f"usage: python -m {module} ")


def test_cli_runs_the_toy_task(tmp_path, capsys):
    results = main(
        ["--config", "toy", "--out", str(tmp_path), "--max-steps", "3", "--no-progress",
         "--set", "toy_examples=200", "--set", "dropout=0.2"]
    )  # fmt: skip
    assert results["steps"] == 3
    assert json.loads((tmp_path / "config.json").read_text())["model"]["dropout"] == 0.2
    assert '"steps": 3' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--config", "gpu"], True),  # the configuration's own setting
        (["--config", "gpu", "--no-compile"], False),
        (["--config", "cpu"], False),
        (["--config", "cpu", "--compile"], True),
    ],
)
def test_cli_compile_switch(argv, expected, tmp_path, monkeypatch):
    seen = {}

    def record(config, **options):  # stands in for companion.run.train: no training
        seen["compile"] = config.compile
        raise SystemExit(0)

    monkeypatch.setattr(companion.run, "train", record)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *argv])
    assert seen["compile"] is expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "laptop"], "invalid choice: 'laptop'"),
        (["--time-budget", "0"], "must be a positive number of seconds, got 0"),
        (["--time-budget", "-3"], "must be a positive number of seconds"),
        (["--max-steps", "0"], "must be >= 1, got 0"),
        (["--set", "colour=blue"], "unknown field 'colour'"),
        (["--set", "dropout=high"], "expected a value of type float, got 'high'"),
        (["--set", "dropout=1.5"], "dropout must be in [0, 1), got 1.5"),
    ],
)
def test_cli_errors(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_build_model_uses_padding_id(tiny_config):
    model = build_model(tiny_config, 14, 14)
    assert model.config.src_pad_id == model.config.tgt_pad_id == PAD_ID
