"""Train short, test long: chapter *Claims*' length experiment with ALiBi beside the other schemes.

    python bench/length.py            # the large setting, its 5 seeds: ~25 runs of ~6 s on 2 idle cores
    python bench/length.py --seeds 0 1 2
    python bench/length.py --quick    # small setting, 2 steps, seeds 0 1 (smoke test)

Runs ``tc.claims.length_generalisation`` (train on windows of ``C`` tokens, measure the loss at every
position of held-out windows ``factor * C`` long; factor 4) with the position schemes ``sinusoidal``
(the baseline), ``learned`` (a table of ``4C`` rows, the last ``3C`` never trained), ``rope``
(``tc.extensions.rope_scheme``), ``alibi`` (``tc.extensions.alibi.alibi_scheme``, Press et al. 2022)
and ``none`` (no position code at all: ALiBi without its biases, for reference). Prints every seed's
``loss_in_range`` and ``loss_beyond``, the loss by position in bins, the tables and the paired
comparisons; the last line is one JSON object whose ``length`` is the :class:`ClaimResult` (every run,
with its ``loss_by_position``). Store it as ``bench/results/cpu/length.json``.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

import transformer_course as tc
from transformer_course.extensions import rope_scheme
from transformer_course.extensions.alibi import alibi_scheme
from transformer_course.runtime import machine

SCHEMES = {
    "sinusoidal": "sinusoidal",
    "learned": "learned",
    "rope": rope_scheme,
    "alibi": alibi_scheme,
    "none": "none",
}
COMPARISONS = [("alibi", "sinusoidal"), ("alibi", "rope"), ("alibi", "none"),
               ("rope", "sinusoidal"), ("learned", "sinusoidal")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=["small", "large"], default="large")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the setting's")
    parser.add_argument("--steps", type=int, default=None, help="fewer steps (smoke tests)")
    parser.add_argument("--factor", type=int, default=4, help="evaluation length / training length")
    parser.add_argument("--quick", action="store_true", help="small setting, 2 steps, seeds 0 1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.setting, args.steps, args.seeds = "small", 2, [0, 1]
    device = tc.default_device(args.device)
    setting = tc.claims.SETTINGS[args.setting]
    seeds = list(setting.seeds if args.seeds is None else args.seeds)
    C = setting.model.block_size
    print(f"machine: {machine(device)}")
    print(f"setting: {args.setting}: {setting}")
    print(f"seeds: {seeds}; train at C = {C}, evaluate to {args.factor} C = {args.factor * C}")
    t0 = time.perf_counter()
    result = tc.claims.length_generalisation(
        SCHEMES, setting=setting, seeds=seeds, device=device, steps=args.steps, log=print,
        factor=args.factor,
    )  # fmt: skip
    total = time.perf_counter() - t0
    bins = max(1, C // 4)
    print(f"\nper seed (loss per character; by position: mean over bins of {bins} positions)")
    for v in result.variants:
        for seed in seeds:
            (run,) = [r for r in result.runs if r.variant == v and r.seed == seed]
            if run.val_loss is None:
                print(f"  {v:<11} seed {seed}: diverged at step {run.diverged_at}")
                continue
            ell = run.extra["loss_by_position"]
            binned = [
                sum(ell[i : i + bins]) / len(ell[i : i + bins]) for i in range(0, len(ell), bins)
            ]
            print(f"  {v:<11} seed {seed}: loss_in_range {run.extra['loss_in_range']:.4f}  "
                  f"loss_beyond {run.extra['loss_beyond']:.4f}  by position: "
                  + " ".join(f"{x:.2f}" for x in binned))  # fmt: skip
    for key in ("loss_in_range", "loss_beyond"):
        print(f"\n{result.table(key)}")
    print()
    comparisons = {}
    for variant, baseline in COMPARISONS:
        for key in ("loss_beyond", "loss_in_range"):
            cmp = result.compare(variant, baseline, key)
            print(cmp.describe())
            comparisons[f"{variant}_minus_{baseline}_{key}"] = {
                "mean": round(cmp.mean, 5), "low": round(cmp.low, 5), "high": round(cmp.high, 5),
                "lower": cmp.lower, "of": len(cmp.diffs), "p_sign": round(cmp.p_sign, 5),
            }  # fmt: skip
    print(f"all runs: {total:.0f} s")
    report(
        {
            "targets": {"total_seconds": ["<=", 1500]},
            "device": str(device),
            "machine": machine(device),
            "setting": args.setting,
            "seeds": seeds,
            "steps": args.steps,
            "factor": args.factor,
            "training_length": C,
            "total_seconds": round(total, 1),
            "comparisons": comparisons,
            "length": result.to_json(),
        }
    )


if __name__ == "__main__":
    main()
