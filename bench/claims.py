"""Claims tested: every claim of the chapter, each variant trained once per seed; the chapter reads them.

    python bench/claims.py --setting large                    # every claim: ~15 min on 2 idle cores
    python bench/claims.py --claim tied_qk --setting large    # one claim
    python bench/claims.py --claim scale --seeds 5 6 7        # other seeds
    python bench/claims.py --quick                            # every claim, 2 steps, 2 seeds (tests)
    python bench/claims.py --setting large --lr 0.004         # every claim at another learning rate

Runs ``tc.claims.CLAIMS[name]`` with the settings fixed in ``tc.claims.SETTINGS`` (``small`` or
``large``; the seeds are the setting's unless ``--seeds`` is given) and prints every seed's figures,
the per-claim tables and the paired comparisons. The last line is one JSON object: ``claims`` maps each
claim to its :class:`ClaimResult` (every run). ``make``-style use: store it as
``bench/results/cpu/claims.json`` (all claims) or ``bench/results/cpu/claims/<name>.json`` (one claim,
which the chapter prefers to the same claim in ``claims.json``); with ``--lr``, as
``bench/results/cpu/claims-lr/lr<rate>.json`` (``make bench-long`` records ``tc.claims.LR_GRID``).
Target: the large setting of every claim within 20 minutes (``total_seconds``).
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

import transformer_course as tc
from transformer_course.claims import CLAIMS
from transformer_course.runtime import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claim", choices=["all", *CLAIMS], default="all")
    parser.add_argument("--setting", choices=["small", "large"], default="small")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the setting's")
    parser.add_argument("--steps", type=int, default=None, help="fewer steps (smoke tests)")
    parser.add_argument("--quick", action="store_true", help="small setting, 2 steps, seeds 0 1")
    parser.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (default: the setting's)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.setting, args.steps, args.seeds = "small", 2, [0, 1]
    device = tc.default_device(args.device)
    names = list(CLAIMS) if args.claim == "all" else [args.claim]
    print(f"machine: {machine(device)}")
    setting = tc.claims.SETTINGS[args.setting]
    setting = setting if args.lr is None else tc.claims.at_rate(setting, args.lr)
    print(f"setting: {setting}")
    t0 = time.perf_counter()
    results = {}
    for name in names:
        result = CLAIMS[name](
            setting=setting, seeds=args.seeds, device=device, steps=args.steps, log=print
        )
        print(result.table())
        for variant in result.variants[1:]:
            print(result.compare(variant).describe())
        results[name] = result.to_json()
    total = time.perf_counter() - t0
    print(f"all claims: {total:.0f} s")
    report(
        {
            "targets": {"total_seconds": ["<=", 1200]},
            "device": str(device),
            "machine": machine(device),
            "setting": args.setting,
            "lr": setting.train.lr,
            "steps": args.steps,
            "seeds": args.seeds,
            "total_seconds": round(total, 1),
            "claims": results,
        }
    )


if __name__ == "__main__":
    main()
