"""Chapter 8's translator trained for a fixed number of steps, in variants and seeds, scored on
the way. One script for three records of issue #32:

1. the **warm-up ablation** (Pre-LN with and without the 300-step ramp, and the peak learning
   rate), decided by **validation** BLEU at the chapter's step budget, three seeds or more;
2. the chapter's **reference table**: validation loss and test BLEU (greedy, beam 4) after
   each of ``--checkpoints`` steps, for the seeds of ``--full-eval-seeds`` (every seed is
   scored in full after its last step);
3. the **seed table** (mean ± sd over the seeds) that the chapter shows beside its bootstrap
   interval.

The learning-rate schedule does not depend on where a run stops, so one run scored after
100, 200, ... steps gives exactly the weights of runs stopped there (the scoring switches the
model to evaluation mode and draws no random numbers; ``tests/test_trainer.py`` checks that a
run trained in pieces equals a run trained at once).

    .venv/bin/python benchmarks/translator_runs.py --variants warmup no-warmup --seeds 0 1 2
    .venv/bin/python benchmarks/translator_runs.py --variants warmup --seeds 0 \\
        --checkpoints 100 200 300 400 500 600 800 1000 --full-eval-seeds 0
    .venv/bin/python benchmarks/translator_runs.py --summarise
    .venv/bin/python benchmarks/translator_runs.py --write-reference warmup --steps 600

Each finished run is merged into ``--out`` (JSON, default
``benchmarks/results/translator_runs.json``) under the key ``variant/seed/threads``; a run
already there is skipped unless ``--again``. ``--write-reference VARIANT`` writes the
chapter's reference, ``companion/results/translator.json`` (:mod:`companion.reference_runs`),
from the recorded runs of that variant: the seed whose checkpoints have test BLEU, and every
seed's scores after ``--steps`` steps. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from companion.configs import get_config  # noqa: E402
from companion.metrics import Translator, corpus_bleu, length_ratio  # noqa: E402
from companion.run import build_model, prepare_data  # noqa: E402
from companion.trainer import Trainer  # noqa: E402
from companion.utils import set_threads  # noqa: E402

#: name → changes to the ``cpu`` configuration (peak rate = lr_factor · 256^-0.5 · 300^-0.5)
VARIANTS: dict[str, dict] = {
    "warmup": {"warmup": True},  # a 300-step ramp to 1.8e-3, then 1/sqrt(step)
    "no-warmup": {"warmup": False},  # the same schedule without the ramp: 1.8e-3 from step 1
    "no-warmup-half": {"warmup": False, "lr_factor": 0.25},  # 0.9e-3 from step 1
    "no-warmup-double": {"warmup": False, "lr_factor": 1.0},  # 3.6e-3 from step 1
    "warmup-double": {"warmup": True, "lr_factor": 1.0},  # a ramp to 3.6e-3
}
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "translator_runs.json"
REFERENCE = ROOT / "companion" / "results" / "translator.json"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "torch": torch.__version__, "python": platform.python_version()}


def score(trainer: Trainer, data, full: bool) -> dict:
    """Validation loss and greedy validation BLEU; with ``full`` also test BLEU, greedy and
    beam 4, the beam's length penalty α chosen on validation from the configuration's grid
    as ``python -m companion.run`` chooses it (each α's BLEU recorded), and length ratios."""
    model, config = trainer.model, trainer.config
    record = {"step": trainer.step, "train_seconds": round(trainer.elapsed, 1)}
    start = time.perf_counter()
    record["val_loss"] = trainer.evaluate()
    val_sources, val_refs = [s for s, _ in data.val.pairs], [r for _, r in data.val.pairs]
    greedy = Translator(model, data.tokenizer, data.src_vocab, data.tgt_vocab, beam_size=1)
    record["val_bleu_greedy"] = corpus_bleu(greedy.translate(val_sources), val_refs)
    if full:
        test_sources, test_refs = [s for s, _ in data.test_pairs], [r for _, r in data.test_pairs]
        outputs = greedy.translate(test_sources)
        record["test_bleu_greedy"] = corpus_bleu(outputs, test_refs)
        record["test_length_ratio_greedy"] = length_ratio(outputs, test_refs)
        beam = Translator(model, data.tokenizer, data.src_vocab, data.tgt_vocab, beam_size=4)
        grid = list(config.length_penalty_grid)
        by_alpha = {a: corpus_bleu(t, val_refs)
                    for a, t in beam.translate_with_penalties(val_sources, grid).items()}  # fmt: skip
        alpha = max(by_alpha, key=by_alpha.__getitem__)  # the first best, as companion.run
        record["val_bleu_beam4_by_alpha"] = {str(a): b for a, b in by_alpha.items()}
        record["alpha"] = alpha
        record["val_bleu_beam4"] = by_alpha[alpha]
        test_by_alpha = beam.translate_with_penalties(test_sources, grid)
        record["test_bleu_beam4"] = corpus_bleu(test_by_alpha[alpha], test_refs)
        record["test_length_ratio_beam4"] = length_ratio(test_by_alpha[alpha], test_refs)
        record["test_bleu_beam4_by_alpha"] = {
            str(a): corpus_bleu(t, test_refs) for a, t in test_by_alpha.items()
        }  # for the record only: α is never chosen on test
    record["score_seconds"] = round(time.perf_counter() - start, 1)
    return record


def run(variant: str, seed: int, steps: int, checkpoints: list[int], full: bool, data) -> dict:
    config = get_config("cpu", **VARIANTS[variant], seed=seed, time_budget=None, max_steps=steps)
    torch.manual_seed(config.seed)  # as companion.run.train seeds
    model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
    torch.manual_seed(config.seed + 1)
    trainer = Trainer(model, config, data.train, data.val, progress=True)
    points = []
    for checkpoint in sorted({*checkpoints, steps}):
        if checkpoint > steps:
            break
        trainer.fit(max_steps=checkpoint)
        points.append(score(trainer, data, full or checkpoint == steps))  # every seed's last
        print(f"  {variant} seed {seed} step {checkpoint}: "
              + ", ".join(f"{k} {v:.3f}" for k, v in points[-1].items() if isinstance(v, float)),
              flush=True)  # fmt: skip
    history = trainer.history
    every = max(1, len(history.loss) // 200)
    return {
        "variant": variant,
        "changes": VARIANTS[variant],
        "seed": seed,
        "threads": torch.get_num_threads(),
        "steps": steps,
        "checkpoints": points,
        "train_loss": [round(x, 4) for x in history.loss[::every]],
        "train_loss_every": every,
        "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def summarise(path: Path) -> None:
    records = json.loads(path.read_text()) if path.exists() else {}
    by_variant: dict[tuple, list[dict]] = {}
    for record in records.values():
        by_variant.setdefault((record["variant"], record["steps"]), []).append(record)
    print(
        f"{'variant':18s} {'steps':>5s} {'seeds':>5s}  val loss        val BLEU greedy   test greedy  test beam 4"
    )
    for (variant, steps), runs in sorted(by_variant.items()):
        finals = [r["checkpoints"][-1] for r in runs]

        def stat(key: str, digits: int, finals=finals) -> str:
            values = [f[key] for f in finals if key in f]
            if not values:
                return "-"
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"

        print(f"{variant:18s} {steps:5d} {len(runs):5d}  {stat('val_loss', 3):15s} "
              f"{stat('val_bleu_greedy', 2):17s} {stat('test_bleu_greedy', 2):12s} "
              f"{stat('test_bleu_beam4', 2)}")  # fmt: skip


def write_reference(path: Path, variant: str, steps: int) -> None:
    """``companion/results/translator.json``'s ``cpu`` entry from the recorded runs."""
    records = [r for r in json.loads(path.read_text()).values()
               if r["variant"] == variant and r["steps"] == steps]  # fmt: skip
    full = [r for r in records if "test_bleu_greedy" in r["checkpoints"][0]]
    if not full:
        raise SystemExit(f"no run of {variant} with {steps} steps has test BLEU at its checkpoints")
    main_run = min(full, key=lambda r: r["seed"])
    same = [r for r in records if r["threads"] == main_run["threads"]]
    if len(same) < 3:
        raise SystemExit(f"the seed table needs 3 seeds or more, {variant} has {len(same)}")
    scores = [k for k, v in main_run["checkpoints"][0].items()
              if isinstance(v, float) and k != "score_seconds"]  # fmt: skip
    finals = {k: [r["checkpoints"][-1][k] for r in sorted(same, key=lambda r: r["seed"])]
              for k in scores if all(k in r["checkpoints"][-1] for r in same)}  # fmt: skip
    entry = {
        "changes": main_run["changes"],
        "steps": [c["step"] for c in main_run["checkpoints"]],
        "values": {k: [round(c[k], 4) for c in main_run["checkpoints"]] for k in scores},
        "seed_steps": steps,
        "seeds": {k: [round(v, 4) for v in values] for k, values in finals.items()},
        "seed_list": sorted(r["seed"] for r in same),
        "machine": f"{main_run['machine']['cpu']}, torch {main_run['machine']['torch']}, "
        f"{main_run['threads']} threads",
        "date": main_run["date"],
        "source": f"benchmarks/translator_runs.py --write-reference {variant} --steps {steps}",
    }
    all_records = json.loads(path.read_text()).values()
    ablation = {}  # every variant with 3 seeds or more at this budget: the warm-up question
    for name in VARIANTS:
        runs = sorted((r for r in all_records if r["variant"] == name and r["steps"] == steps),
                      key=lambda r: r["seed"])  # fmt: skip
        if len(runs) >= 3:
            last = [r["checkpoints"][-1] for r in runs]
            steps_seen = [c["step"] for c in runs[0]["checkpoints"]]
            ablation[name] = {
                "changes": VARIANTS[name],
                "seeds": [r["seed"] for r in runs],
                "curve_steps": steps_seen,  # the validation loss on the way, mean of the seeds
                "val_loss_curve": [
                    round(
                        statistics.mean(
                            c["val_loss"]
                            for r in runs
                            for c in r["checkpoints"]
                            if c["step"] == step
                        ),
                        4,
                    )
                    for step in steps_seen
                ],  # fmt: skip
                "threads": sorted({r["threads"] for r in runs}),
                **{
                    k: [round(c[k], 4) for c in last]
                    for k in ("val_loss", "val_bleu_greedy", "val_bleu_beam4")
                    if all(k in c for c in last)
                },  # fmt: skip
            }
    entry["ablation"] = ablation
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {}
    reference["cpu"] = entry
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")
    print(f"wrote {REFERENCE.relative_to(ROOT)}: cpu = {variant}, seeds {entry['seed_list']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["warmup"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=600, help="optimiser steps of each run")
    parser.add_argument("--checkpoints", nargs="*", type=int, default=[], help="score here too")
    parser.add_argument("--full-eval-seeds", nargs="*", type=int, default=[],
                        help="seeds whose checkpoints also get test BLEU (greedy and beam 4)")  # fmt: skip
    parser.add_argument("--threads", type=int, help="torch threads (default: set_threads())")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--again", action="store_true", help="rerun runs already recorded")
    parser.add_argument("--summarise", action="store_true", help="print the table and stop")
    parser.add_argument("--write-reference", metavar="VARIANT", choices=VARIANTS,
                        help="write companion/results/translator.json from this variant's runs")  # fmt: skip
    args = parser.parse_args()
    if args.write_reference:
        write_reference(args.out, args.write_reference, args.steps)
        return
    if args.summarise:
        summarise(args.out)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    else:
        print(set_threads(), flush=True)
    data = prepare_data(get_config("cpu"), args.data_root, progress=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        for seed in args.seeds:
            key = f"{variant}/{seed}/{torch.get_num_threads()}/{args.steps}"
            records = json.loads(args.out.read_text()) if args.out.exists() else {}
            if key in records and not args.again:
                print(f"{key}: recorded already (--again to rerun)")
                continue
            print(f"=== {key}", flush=True)
            record = run(variant, seed, args.steps, args.checkpoints,
                         seed in args.full_eval_seeds, data)  # fmt: skip
            with open(args.out.with_suffix(".lock"), "w") as lock:  # runs in parallel share it
                fcntl.flock(lock, fcntl.LOCK_EX)
                records = json.loads(args.out.read_text()) if args.out.exists() else {}
                records[key] = record
                tmp = args.out.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(records, indent=1) + "\n")
                tmp.replace(args.out)
    summarise(args.out)


if __name__ == "__main__":
    main()
