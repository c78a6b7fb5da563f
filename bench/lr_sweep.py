"""Learning-rate sweep: the loss after a fixed short budget against the peak learning rate, at three widths.

    python bench/lr_sweep.py --threads 1    # the full sweep: 3 widths x 8 rates, about 15 min on one core
    python bench/lr_sweep.py --quick        # a few seconds: 2 tiny widths, 3 rates, 6 steps (tests)

Every run is ``tc.language_models.train_char_lm`` with ``tc.training.lr_sweep_recipe``: the CPU recipe
(``SHAKESPEARE_CPU_RECIPE``: batches of 64 windows of 64 characters, AdamW, cosine decay to a tenth of
the peak, clipping at 1) with a two-block GPT of width 32, 64 or 128 (heads of width 16), trained for
400 steps of which 40 warm up, seed 0 (the same initial weights per width and the same batches), and
scored by its validation loss on 10 fixed batches of the held-out text. The peak learning rates are
``tc.training.LR_GRID``, 1e-3 to 0.128 a factor of 2 apart. For each width
``tc.training.best_learning_rate`` reads the best rate off a parabola in the log learning rate through
the grid's best point and its two neighbours (book eq. ``eq-train-vertex``).

Targets: the whole sweep within 20 minutes, and the best rate of every width inside the grid (a
bracketed minimum). The last line is one JSON object (``bench/results/cpu/lr_sweep.json``).
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

import transformer_course as tc
from transformer_course.runtime import machine
from transformer_course.training import (
    LR_GRID,
    LR_SWEEP_STEPS,
    LR_SWEEP_WIDTHS,
    best_learning_rate,
    lr_sweep,
)

QUICK = {"widths": (16, 32), "lrs": (1e-3, 1e-2, 1e-1), "steps": 6, "eval_batches": 2}
TARGETS = {"total_seconds": ["<=", 1200], "all_bracketed": ["==", True]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny widths, three rates, six steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    settings = QUICK if args.quick else {
        "widths": LR_SWEEP_WIDTHS, "lrs": LR_GRID, "steps": LR_SWEEP_STEPS, "eval_batches": 10,
    }  # fmt: skip
    print(f"machine: {machine(device)}")
    t0 = time.perf_counter()

    def show(r: dict) -> None:
        loss = "diverged" if r["diverged"] else f"val_loss={r['val_loss']:.4f}"
        print(f"D={r['d_model']:4d} lr={r['lr']:.4g} {loss} ({r['seconds']:.1f} s)", flush=True)

    runs = lr_sweep(**settings, device=device, seed=args.seed, report=show)
    best = {}
    for width in settings["widths"]:
        mine = [r for r in runs if r["d_model"] == width]
        best[str(width)] = {
            **best_learning_rate([r["lr"] for r in mine], [r["val_loss"] for r in mine]),
            "params": next(r["params"] for r in mine if r["params"] is not None),
        }
        b = best[str(width)]
        print(
            f"D={width}: best on the grid lr={b['grid_lr']:.4g} ({b['grid_loss']:.4f}); "
            f"parabola vertex lr={b['lr']:.4g} ({b['loss']:.4f}), bracketed: {b['bracketed']}"
        )
    report(
        {
            "targets": {} if args.quick else TARGETS,
            "quick": args.quick,
            "device": str(device),
            "machine": machine(device),
            "threads": torch.get_num_threads(),
            "seed": args.seed,
            "widths": list(settings["widths"]),
            "lrs": list(settings["lrs"]),
            "steps": settings["steps"],
            "eval_batches": settings["eval_batches"],
            "runs": runs,
            "best": best,
            "all_bracketed": all(b["bracketed"] for b in best.values()),
            "total_seconds": round(time.perf_counter() - t0, 1),
        }
    )


if __name__ == "__main__":
    main()
