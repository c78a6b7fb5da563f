"""Modern GPT benchmark: the GPT-2-style ``SHAKESPEARE_CPU`` model against the modern preset (RMSNorm,
SwiGLU, RoPE, no position table) at an equal time budget on tiny-shakespeare; and RoPE in chapter
*Claims*' length experiment.

    python bench/modern.py              # 3 seeds x 2 models, 60 s of training each, then the length
                                        # experiment (about 10 minutes on 2 idle cores)
    python bench/modern.py --quick      # smoke test: one seed, a few steps each

Both models have ``SHAKESPEARE_CPU``'s sizes (2 layers, 4 heads, width 128, context 64) and train
with ``SHAKESPEARE_CPU_RECIPE``'s optimisation settings, unchanged, through the course's one loop
(``tc.language_models.train_char_lm`` and ``tc.extensions.train_modern_lm``, which differ only in the
model class). Equal time, not equal steps: each model's speed on this machine is measured first (a
short run of ``--calibration-steps`` steps), and its step count is set so that its whole learning-rate
schedule fits in ``--budget-s`` seconds; a run that is still slower than expected stops at 1.25 times
the budget. For every seed both models see the same batches (the loop's generator is seeded by the
seed) and are evaluated on the same held-out windows. Reported: each run's validation loss, steps and
seconds, the mean and standard deviation per model, and the per-seed difference (modern minus GPT);
whether the last modern model generates the same tokens with and without its key-value cache.

Then ``tc.claims.length_generalisation`` (its recorded ``large`` setting and seeds) with three
position schemes: sinusoidal codes (the baseline), a learned table whose last row is reused beyond the
training length, and RoPE (``tc.extensions.rope_scheme``: the same model with rotary attention and no
position code); the loss beyond the training length, per seed. Skipped, with a note, when that chapter's
function is missing. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics

import torch
from common import report

import transformer_course as tc
from transformer_course.extensions import MODERN_CPU_RECIPE, rope_scheme, train_modern_lm
from transformer_course.language_models import (
    SHAKESPEARE_CPU_RECIPE,
    generate,
    seconds_per_step,
    train_char_lm,
)
from transformer_course.runtime import machine

MODELS = {
    "gpt": (SHAKESPEARE_CPU_RECIPE, train_char_lm),
    "modern": (MODERN_CPU_RECIPE, train_modern_lm),
}


def steps_per_second(name: str, steps: int, device: torch.device) -> float:
    """Training steps per second of model ``name`` (``tc.language_models.seconds_per_step``: a run
    of ``steps`` steps against one of ``steps // 4``, so that one-time costs cancel)."""
    recipe, run_fn = MODELS[name]
    return 1 / seconds_per_step(recipe, device, steps, run=run_fn)


def length_experiment(setting: str, quick: bool, device: torch.device) -> dict | None:
    """Chapter *Claims*' length experiment with RoPE added as a position scheme, in that chapter's
    ``setting`` (two steps of it with ``quick``); ``None`` when the setting is ``"none"`` or that
    chapter's ``length_generalisation`` is not in the package."""
    if setting == "none":
        return None
    try:
        claims = importlib.import_module("transformer_course.claims")
    except ImportError:
        claims = None
    if not hasattr(claims, "length_generalisation"):
        print("length experiment: tc.claims.length_generalisation is missing; skipped")
        return None
    schemes = {"sinusoidal": "sinusoidal", "learned_clamp": "learned_clamp", "rope": rope_scheme}
    kwargs = {"setting": setting, "steps": 2, "seeds": [0]} if quick else {"setting": setting}
    result = claims.length_generalisation(schemes, device=device, log=print, **kwargs)
    print(result.table())
    out = {"setting": kwargs["setting"], "metric": result.metric, "variants": result.variants}
    for key in ("loss_beyond", "loss_in_range"):
        out[key] = {v: result.values(v, key) for v in result.variants}
    base, rope = (result.values(v, "loss_beyond") for v in ("sinusoidal", "rope"))
    out["rope_minus_sinusoidal_beyond"] = {
        s: round(rope[s] - base[s], 4) for s in sorted(rope) if None not in (rope[s], base[s])
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--budget-s", type=float, default=60.0, help="training seconds per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--calibration-steps", type=int, default=60)
    parser.add_argument("--eval-batches", type=int, default=None, help="default: the recipe's")
    parser.add_argument(
        "--length-setting",
        choices=["large", "small", "none"],
        default=None,
        help="setting of the length experiment (default: large; small with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="one seed, a few steps (tests)")
    args = parser.parse_args()
    if args.calibration_steps < 8:
        parser.error(
            "--calibration-steps must be >= 8 (the short run of the timing takes a quarter)"
        )
    if args.quick:
        args.seeds, args.eval_batches = [0], args.eval_batches or 2
    args.length_setting = args.length_setting or ("small" if args.quick else "large")
    device = tc.default_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    print(f"machine: {machine(device)}")

    if args.quick:  # no calibration: a fixed handful of steps, to test the plumbing
        rates, steps = {name: 0.0 for name in MODELS}, {name: 3 for name in MODELS}
    else:
        rates = {name: steps_per_second(name, args.calibration_steps, device) for name in MODELS}
        steps = {name: max(2, int(args.budget_s * rate)) for name, rate in rates.items()}
    for name in MODELS:
        print(f"{name}: {rates[name]:.2f} steps/s measured -> {steps[name]} steps in the budget "
              f"of {args.budget_s:g} s")  # fmt: skip

    runs: dict[str, list[dict]] = {name: [] for name in MODELS}
    params = {}
    for seed in args.seeds:
        for name, (recipe, run_fn) in MODELS.items():  # alternate, so drift hits both models
            recipe = dataclasses.replace(
                recipe,
                train=dataclasses.replace(
                    recipe.train, time_budget_s=None if args.quick else 1.25 * args.budget_s
                ),
                eval_batches=args.eval_batches or recipe.eval_batches,
            )
            run = run_fn(recipe, device, steps=steps[name], seed=seed)
            hist = run.history
            params[name] = run.model.num_params()
            runs[name].append(
                {
                    "seed": seed,
                    "val_loss": round(run.val_loss, 4),
                    "steps": hist.steps_done,
                    "seconds": round(hist.seconds, 2),
                    "val_loss_by_step": dict(
                        zip(hist.eval_step, hist.evals["val_loss"], strict=True)
                    ),
                }
            )
            print(f"seed {seed} {name:>6}: val loss {run.val_loss:.4f} after {hist.steps_done} "
                  f"steps in {hist.seconds:.1f} s")  # fmt: skip

    prompt = torch.tensor([run.tokenizer.encode("\n")], device=device)  # the last modern model
    n_new = 20 if args.quick else 300  # past the context of 64: the cache is rebuilt as it slides
    kv_identical = torch.equal(
        generate(run.model, prompt, n_new, greedy=True),
        generate(run.model, prompt, n_new, greedy=True, use_cache=False),
    )
    print(f"modern model, greedy generation of {n_new} tokens: cached == uncached: {kv_identical}")
    length = length_experiment(args.length_setting, args.quick, device)

    losses = {name: [r["val_loss"] for r in rs] for name, rs in runs.items()}
    diffs = [m - g for m, g in zip(losses["modern"], losses["gpt"], strict=True)]

    def spread(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    summary = {}
    for name, xs in losses.items():
        summary[f"{name}_val_loss_mean"] = round(statistics.fmean(xs), 4)
        summary[f"{name}_val_loss_std"] = round(spread(xs), 4)
        print(f"{name:>6}: {params[name]:,} parameters; val loss {statistics.fmean(xs):.4f} "
              f"+- {spread(xs):.4f} over {len(xs)} seeds")  # fmt: skip
    print(f"modern - gpt, per seed: {', '.join(f'{d:+.4f}' for d in diffs)} (mean "
          f"{statistics.fmean(diffs):+.4f})")  # fmt: skip
    report(
        {
            "targets": {"modern_val_loss_mean": ["<=", 1.80], "modern_kv_identical": ["==", True]},
            "modern_kv_identical": kv_identical,
            "length": length,
            "device": str(device),
            "machine": machine(device),
            "budget_s": args.budget_s,
            "seeds": args.seeds,
            "quick": args.quick,
            "steps_per_s": {name: round(r, 3) for name, r in rates.items()},
            "params": params,
            "runs": runs,
            **summary,
            "diff_modern_minus_gpt": [round(d, 4) for d in diffs],
            "diff_mean": round(statistics.fmean(diffs), 4),
            "diff_min": round(min(diffs), 4),
            "diff_max": round(max(diffs), 4),
        }
    )


if __name__ == "__main__":
    main()
