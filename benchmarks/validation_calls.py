"""Count the Python calls into ``companion`` during one ``Transformer`` forward, and how many
of them are input validation (functions of ``companion._validation`` and ``_check*`` helpers).

Usage: ``python benchmarks/validation_calls.py`` (a 2 + 2 layer model, batch 4, lengths 9/7,
with padding; prints the totals and the most called validation functions).
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

from companion.model import Transformer, TransformerConfig

PAD = 0


def build() -> Transformer:
    settings = dict(src_vocab=20, tgt_vocab=20, d_model=16, num_heads=2, num_layers=2, d_ff=32)
    settings.update(src_pad_id=PAD, tgt_pad_id=PAD)
    try:
        return Transformer(TransformerConfig(**settings))
    except TypeError:  # the package before the one-config-path change
        return Transformer(**settings)


#: The edge's bookkeeping (is this the outermost call?), counted apart from the checks.
GUARDS = ("run", "checks_enabled", "inputs_checked")


def is_validation(code) -> bool:
    name = code.co_name
    if name in GUARDS:
        return False
    return code.co_filename.endswith("_validation.py") or name.startswith(("_check", "check_"))


def main() -> None:
    torch.manual_seed(0)
    model = build().eval()
    src = torch.randint(1, 20, (4, 9))
    tgt = torch.randint(1, 20, (4, 7))
    src[0, -3:] = PAD
    tgt[1, -2:] = PAD
    model(src, tgt)  # warm up (lazy tables)
    calls: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    guards: Counter[str] = Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if "/companion/" not in code.co_filename:
            return
        calls[code.co_name] += 1
        if code.co_filename.endswith("_validation.py") and code.co_name in GUARDS:
            guards[code.co_name] += 1
        if is_validation(code):
            checks[code.co_name] += 1

    sys.setprofile(profile)
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        sys.setprofile(None)
    total, validation = sum(calls.values()), sum(checks.values())
    print(
        f"calls into companion during one forward: {total}; validation: {validation}; "
        f"edge guards (is this the outermost call?): {sum(guards.values())}"
    )
    for name, count in checks.most_common(12):
        print(f"  {count:4d}  {name}")


if __name__ == "__main__":
    main()
