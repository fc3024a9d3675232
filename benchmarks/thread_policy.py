"""What the thread policy (``companion.utils.set_threads``) buys: chapter 8's training step
with 1 and 2 torch threads, on a quiet machine and beside one CPU-bound process.

    .venv/bin/python benchmarks/thread_policy.py --steps 20

For each condition a fresh copy of the ``cpu`` model trains ``--steps`` steps on the first
batches of Multi30k (after 2 untimed ones); the busy process is a plain Python loop started
by this script (one core's worth of work). Prints the median step time of each condition and
what ``set_threads`` chooses in it. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from companion.configs import get_config  # noqa: E402
from companion.data import collate_batch  # noqa: E402
from companion.run import build_model, prepare_data  # noqa: E402
from companion.trainer import Trainer  # noqa: E402
from companion.utils import TORCH_DEFAULT_THREADS, set_threads  # noqa: E402


def step_times(data, threads: int, steps: int) -> list[float]:
    torch.set_num_threads(threads)
    config = get_config("cpu", time_budget=None)
    torch.manual_seed(0)
    model = build_model(config, len(data.src_vocab), len(data.tgt_vocab))
    trainer = Trainer(model, config, data.train, data.val, progress=False)
    times = []
    for indices in trainer.epoch_batches(0)[: steps + 2]:
        src, tgt = collate_batch([data.train[i] for i in indices])  # (batch, len) each
        start = time.perf_counter()
        trainer.train_step(src, tgt)
        times.append(time.perf_counter() - start)
    return times[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    args = parser.parse_args()
    data = prepare_data(get_config("cpu"), args.data_root, progress=False)
    results = {}
    for busy in (False, True):
        loop = None
        if busy:
            loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(2)
        try:
            chosen = set_threads()
            for threads in sorted({1, TORCH_DEFAULT_THREADS}):
                times = step_times(data, threads, args.steps)
                results[busy, threads] = statistics.median(times)
                print(f"{'busy' if busy else 'quiet':5s} {threads} thread(s): median "
                      f"{1000 * results[busy, threads]:,.0f} ms (quartiles "
                      f"{1000 * statistics.quantiles(times, n=4)[0]:,.0f}-"
                      f"{1000 * statistics.quantiles(times, n=4)[2]:,.0f}); set_threads: {chosen}",
                      flush=True)  # fmt: skip
        finally:
            if loop is not None:
                loop.kill()
    quiet = results[False, TORCH_DEFAULT_THREADS]
    for (busy, threads), seconds in results.items():
        print(
            f"{'busy' if busy else 'quiet':5s} {threads} thread(s): {seconds / quiet:.2f} x "
            f"the quiet {TORCH_DEFAULT_THREADS}-thread step"
        )


if __name__ == "__main__":
    main()
