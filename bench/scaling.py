"""Scaling-law study: the same character GPT at six sizes and three token budgets on tiny-shakespeare.

    python bench/scaling.py            # the full study: 6 sizes x 3 budgets, about 10 min on 2 cores
    python bench/scaling.py --quick    # a few seconds: 4 tiny sizes, one short budget (tests)

Every run is ``tc.language_models.train_char_lm`` with ``tc.training.scaled_recipe``: the CPU recipe
(``SHAKESPEARE_CPU_RECIPE``: batches of 64 windows of 64 characters, AdamW at 8e-3, cosine decay,
clipping, the recipe's 100 warm-up steps) with a GPT of width ``d_model`` and ``n_layers`` blocks
(heads of width 16), trained for exactly ``steps`` steps, seed 0, and scored by its validation loss on
20 fixed batches of the held-out text. Sizes run from about 17 thousand to 1.3 million parameters;
budgets are 160, 320 and 640 steps (0.66, 1.3 and 2.6 million tokens).
``tc.training.scaling_analysis`` then fits book eq. ``eq-train-power``, L = a N^(-alpha) + c, per
budget and predicts two sizes left out of the fit.
``--noise`` reads the recorded study (``bench/results/<device>/scaling.json``) and trains its two
held-out sizes at the largest budget with seeds 0, 1 and 2 on this machine, so that the error of a
prediction can be set beside the seed-to-seed spread of the loss it predicts
(``bench/results/<device>/scaling_noise.json``; about 8 minutes on 2 cores).
``--refit`` reads the recorded study and fits its recorded runs again with the current
``scaling_analysis`` (after a change to the fit, not to the training): it prints the study's JSON with
new ``fits`` and ``held_out``, its runs, commit and date unchanged, and a ``refit`` entry naming the
commit and date of the new fit. Nothing is trained; it takes about a second.
Targets: the whole study within 15 minutes, and the size left out in the middle predicted to within
0.05 nats. The last line is one JSON object (``bench/results/cpu/scaling.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time

import torch
from common import commit, report

import transformer_course as tc
from transformer_course.language_models import train_char_lm
from transformer_course.runtime import machine
from transformer_course.training import scaled_recipe, scaling_analysis

SIZES = [(32, 1), (48, 2), (64, 2), (96, 3), (128, 3), (160, 4)]  # (d_model, n_layers)
BUDGETS = [160, 320, 640]  # steps
QUICK_SIZES = [(16, 1), (32, 1), (48, 1), (64, 1)]
QUICK_BUDGETS = [8]
QUICK_WARMUP = 2
NOISE_SEEDS = [0, 1, 2]
EVAL_BATCHES = 20
TARGETS = {"total_seconds": ["<=", 900], "interpolation_error_abs": ["<=", 0.05]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one short budget")
    parser.add_argument("--budgets", type=int, nargs="+", default=None, help="steps (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--noise", action="store_true", help="the recorded study's held-out sizes, seeds 0 1 2"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--refit",
        action="store_true",
        help="fit the recorded study's runs again; nothing is trained",
    )
    args = parser.parse_args()
    if args.refit:
        refit(args.device)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    sizes, budgets = (QUICK_SIZES, QUICK_BUDGETS) if args.quick else (SIZES, BUDGETS)
    budgets = args.budgets or budgets
    print(f"machine: {machine(device)}")
    t0 = time.perf_counter()

    def one_run(d_model: int, n_layers: int, steps: int, seed: int) -> dict:
        recipe = scaled_recipe(
            d_model, n_layers, steps, warmup_steps=QUICK_WARMUP if args.quick else None,
            eval_batches=EVAL_BATCHES,
        )  # fmt: skip
        run = train_char_lm(recipe, device, seed=seed)
        c = run.model.config
        params = run.model.num_params()
        tokens = run.history.steps_done * recipe.batch_size * c.block_size
        r = {
            "d_model": d_model,
            "n_layers": n_layers,
            "seed": seed,
            "params": params,
            "params_non_embedding": params - (c.vocab_size + c.block_size) * d_model,
            "steps": run.history.steps_done,
            "tokens": tokens,
            "flops": 6 * params * tokens,  # Kaplan et al.'s estimate, C = 6 N tokens
            "val_loss": round(run.val_loss, 4),
            "train_seconds": round(run.history.seconds, 2),
        }
        print(
            f"D={d_model:4d} L={n_layers} |theta|={params:>9,} steps={steps:4d} seed={seed} "
            f"val_loss={r['val_loss']:.4f} ({r['train_seconds']:.1f} s)",
            flush=True,
        )
        return r, recipe

    if args.noise:
        recorded = tc.results.load(pathlib.Path(__file__).resolve().parent.parent, device.type)
        study = recorded.get("scaling")
        if study is None or study["quick"]:
            raise SystemExit("--noise needs the recorded study: run bench/scaling.py first")
        last = max(study["budgets"])
        noise_runs = []
        for name, h in study["held_out"].items():
            size = next(
                r for r in study["runs"] if r["params"] == h["params"] and r["steps"] == last
            )
            for seed in NOISE_SEEDS:
                r, _ = one_run(size["d_model"], size["n_layers"], last, seed)
                noise_runs.append({**r, "held_out": name})
        report(
            {
                "targets": {},  # a noise reference, not a figure with a target; the chapter reads it
                "device": str(device),
                "machine": machine(device),
                "study": {k: study[k] for k in ("commit", "date", "machine")},
                "seeds": NOISE_SEEDS,
                "noise_runs": noise_runs,
                "total_seconds": round(time.perf_counter() - t0, 1),
            }
        )
        return
    runs = []
    for steps in budgets:
        for d_model, n_layers in sizes:
            r, recipe = one_run(d_model, n_layers, steps, args.seed)
            runs.append(r)
    fitted = analysed(runs)
    total = time.perf_counter() - t0
    report(
        {
            "targets": {} if args.quick or args.budgets else TARGETS,
            "budgets": budgets,
            "quick": args.quick,
            "device": str(device),
            "machine": machine(device),
            "seed": args.seed,
            "eval_batches": EVAL_BATCHES,
            "batch_size": recipe.batch_size,
            "block_size": recipe.model.block_size,
            "warmup_steps": recipe.train.warmup_steps,
            "lr": recipe.train.lr,
            "runs": runs,
            **fitted,
            "total_seconds": round(total, 1),
        }
    )


def analysed(runs: list[dict]) -> dict:
    """The fields of the result that ``scaling_analysis`` derives from the runs."""
    analysis = scaling_analysis(runs)
    held = analysis["held_out"]
    for steps, fit in analysis["fits"].items():
        print(
            f"fit at {steps} steps: L = {fit['a']:.3g} N^-{fit['alpha']:.3f} + {fit['c']:.3f} "
            f"(rms residual {fit['rms_residual']:.4f})"
        )
    for name, h in held.items():
        print(
            f"{name}: |theta|={h['params']:,} measured {h['measured']:.4f}, predicted "
            f"{h['predicted']:.4f} ({h['error']:+.4f})"
        )
    return {
        "fits": {str(k): v for k, v in analysis["fits"].items()},
        "held_out": held,
        "interpolation_error_abs": abs(held["interpolation"]["error"]) if held else None,
    }


def refit(device: str) -> None:
    """Print the recorded study with its runs fitted again (``--refit``)."""
    recorded = tc.results.load(pathlib.Path(__file__).resolve().parent.parent, device)
    study = recorded.get("scaling")
    if study is None or study["quick"]:
        raise SystemExit("--refit needs the recorded study: run bench/scaling.py first")
    study = dict(study.data)
    print(
        f"refitting the {len(study['runs'])} runs recorded at {study['commit']} ({study['date']})"
    )
    study.update(analysed(study["runs"]))
    study["refit"] = {"commit": commit(), "date": datetime.date.today().isoformat()}
    print(json.dumps(study, sort_keys=True))


if __name__ == "__main__":
    main()
