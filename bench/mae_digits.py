"""Masked auto-encoder on scikit-learn's digits: MAE pre-training plus a linear probe against the
supervised ViT of chapter *Vision transformers*, at the same budget, over paired seeds.

    python bench/mae_digits.py --threads 1        # the committed run: CPU, 600 steps, seeds 0-4
    python bench/mae_digits.py --quick            # smoke test: 3 steps, seeds 0 1
    python bench/mae_digits.py --steps 1800 --seeds 0 1 2 3 4

For each seed ``s`` (the same seed for both arms):

* **MAE + probe**: ``tc.masked.mae.train_mae_digits(MAE_DIGITS_RECIPE, seed=s, steps=S)`` pre-trains
  on the 898 training images without labels, then ``linear_probe`` freezes the encoder and fits a
  logistic regression on its mean-pooled features of the same images (labels used only here);
* **supervised ViT**: ``tc.vision.train_digits(DIGITS_RECIPE, seed=s, steps=S)`` with the time budget
  switched off, so both arms make exactly ``S`` AdamW steps of 128 images (``S * 128`` images seen;
  the ViT's are augmented as its recipe says, the MAE's are not: its random masks are its noise).
  Its test accuracy is reported without the test-time shifts (the probe has none) and with them; its
  own frozen features are probed as well.

Two reference probes cost no training: the encoder at its random initialisation (seed ``s``) and the
raw 64 pixels. The paired difference (MAE probe minus supervised ViT, per seed) gets a 95%
t-interval (``tc.claims.paired_t_interval``). The committed run is ``bench/results/cpu/mae_digits.json``
(the log beside it); the chapter *Masked modelling* reads it. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

import transformer_course as tc
from transformer_course.masked.mae import MAE, MAE_DIGITS_RECIPE, linear_probe, train_mae_digits
from transformer_course.runtime import machine
from transformer_course.vision import DIGITS_RECIPE, train_digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=600, help="optimiser steps of each arm")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="3 steps, seeds 0 1 (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds = 3, [0, 1]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    start = time.perf_counter()
    S, B = args.steps, MAE_DIGITS_RECIPE.batch_size
    assert B == DIGITS_RECIPE.batch_size, "the two recipes must draw equally many images per step"
    supervised = DIGITS_RECIPE.with_train(time_budget_s=None)  # exactly S steps, never cut short
    print(f"machine: {machine(device)}")
    print(
        f"budget: {S} AdamW steps of {B} images per arm ({S * B:,} images seen); seeds {args.seeds}"
    )
    print(f"MAE: {MAE_DIGITS_RECIPE.model}")
    raw = linear_probe(None).test_accuracy
    print(f"linear probe on the raw 64 pixels: test accuracy {raw:.4f}")
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        run = train_mae_digits(MAE_DIGITS_RECIPE, device, seed=seed, steps=S)
        mae_probe = linear_probe(run.model.encoder)
        torch.manual_seed(seed)
        random_probe = linear_probe(MAE(MAE_DIGITS_RECIPE.model).to(device).encoder)
        vit = train_digits(supervised, device, steps=S, seed=seed)
        vit_probe = linear_probe(vit.model)
        row = {
            "seed": seed,
            "mae_probe": round(mae_probe.test_accuracy, 4),
            "mae_probe_train": round(mae_probe.train_accuracy, 4),
            "mae_test_loss": round(run.history.evals["test_loss"][-1], 5),
            "mae_steps": run.history.steps_done,
            "mae_train_seconds": round(run.history.seconds, 1),
            "random_encoder_probe": round(random_probe.test_accuracy, 4),
            "vit": round(vit.test_accuracy_no_shifts, 4),
            "vit_with_shifts": round(vit.test_accuracy, 4),
            "vit_probe": round(vit_probe.test_accuracy, 4),
            "vit_steps": vit.history.steps_done,
            "vit_train_seconds": round(vit.history.seconds, 1),
        }
        rows.append(row)
        print(
            f"seed {seed}: MAE probe {row['mae_probe']:.4f} (train {row['mae_probe_train']:.4f}, "
            f"masked test loss {row['mae_test_loss']:.4f}); random encoder probe "
            f"{row['random_encoder_probe']:.4f}; supervised ViT {row['vit']:.4f} "
            f"({row['vit_with_shifts']:.4f} with shifts; its features probed {row['vit_probe']:.4f}); "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    col = {k: [r[k] for r in rows] for k in rows[0]}
    diff = tc.claims.paired_t_interval(col["vit"], col["mae_probe"])
    gain = tc.claims.paired_t_interval(col["random_encoder_probe"], col["mae_probe"])
    print(
        f"MAE probe - supervised ViT: {diff[0]:+.4f}, 95% t-interval [{diff[1]:+.4f}, {diff[2]:+.4f}]"
    )
    print(f"MAE probe - random-encoder probe: {gain[0]:+.4f} [{gain[1]:+.4f}, {gain[2]:+.4f}]")
    report(
        {
            "targets": {},  # a comparison, not a figure with a target; the chapter reads it
            "wall_seconds": round(time.perf_counter() - start, 1),
            "device": str(device),
            "machine": machine(device),
            "steps": S,
            "batch_size": B,
            "images_seen": S * B,
            "seeds": args.seeds,
            "mask_ratio": MAE_DIGITS_RECIPE.model.mask_ratio,
            "raw_pixel_probe": round(raw, 4),
            "per_seed": rows,
            "mean": {k: round(sum(v) / len(v), 4) for k, v in col.items() if k != "seed"},
            "mae_minus_vit": [round(x, 4) for x in diff],
            "mae_minus_random_encoder": [round(x, 4) for x in gain],
            "quick": args.quick,
        }
    )


if __name__ == "__main__":
    main()
