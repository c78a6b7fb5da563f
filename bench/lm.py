"""Language-model benchmark: train a character GPT on tiny-shakespeare, then check cached generation.

    python bench/lm.py                              # the CPU recipe, fitted to 120 s of this CPU
    python bench/lm.py --preset minute              # the minute recipe, fitted to 60 s
    python bench/lm.py --device cuda --preset gpu   # nanoGPT's shakespeare_char size on a GPU

Trains with one of the package's recipes (``SHAKESPEARE_CPU_RECIPE``, ``SHAKESPEARE_MINUTE_RECIPE`` or
``SHAKESPEARE_GPU_RECIPE``, run by ``tc.language_models.train_char_lm``) and reports the validation
loss, the mean over a fixed set of held-out batches (90/10 split). On a CPU the ``cpu`` and ``minute``
recipes are fitted to their time budget on this machine, any recipe to ``--seconds``
(``tc.language_models.fit_to_time``: the step is timed and the schedule gets 90 % of the steps that
fit), so that a slow machine and a fast one both reach the end of the schedule in about the same time;
a machine that slows down by more than that margin is stopped by the budget's guard before the end.
``--seconds 0`` runs the recipe's own steps within its own budget. Targets on 2 CPU cores: ``val_loss
<= 1.55`` in 120 s (``cpu``) and ``<= 1.70`` in 60 s (``minute``); on an H100 the GPU preset:
``val_loss <= 1.47`` in at most 60 s. Then it generates 500 tokens greedily with and without the
key-value cache and checks that the tokens are identical.

Also reported: tokens/s, the time of a step and the model FLOPs per second (``step_flops``), on a
listed GPU as a fraction of its data-sheet bfloat16 peak (the MFU). For studies, ``--train lr=1e-2``
and ``--model d_model=96`` change the recipe's settings; the JSON records what ran. Decoding speed
is ``bench/decode.py``'s. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import time

import torch
from common import bf16_dense_peak, report, sync

import transformer_course as tc
from transformer_course.language_models import (
    SHAKESPEARE_CPU_RECIPE,
    SHAKESPEARE_GPU_RECIPE,
    SHAKESPEARE_MINUTE_RECIPE,
    fit_to_time,
    generate,
    train_char_lm,
)
from transformer_course.language_models.recipe import FIT_MARGIN
from transformer_course.runtime import machine
from transformer_course.training.accounting import step_flops

RECIPES = {
    "cpu": SHAKESPEARE_CPU_RECIPE,
    "minute": SHAKESPEARE_MINUTE_RECIPE,
    "gpu": SHAKESPEARE_GPU_RECIPE,
}
FITTED_ON_CPU = {"cpu", "minute"}  # the presets fitted to their budget on a CPU by default
# the validation-loss targets: (device type, preset, seconds of training)
VAL_TARGETS = {("cpu", "cpu", 120): 1.55, ("cpu", "minute", 60): 1.70, ("cuda", "gpu", 60): 1.47}


def settings(flag: str, items: list[str], current, refused: tuple[str, ...] = ()) -> dict:
    """``["lr=1e-2", "betas=(0.9, 0.95)", "tie_weights=False"]`` as changes of the dataclass
    ``current``: each value read as a Python literal (a number, a tuple, ``True``, ``None``); text is
    kept as text only for a setting whose value is text (``autocast=bfloat16``). A number must
    replace a number and a truth value a truth value. Raises ``SystemExit`` naming ``flag`` and the
    setting that is wrong, or one of ``refused`` (settings another part of the run decides)."""
    fields = {f.name for f in dataclasses.fields(current)} - set(refused)
    changes = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(
                f"{flag} {item!r}: write SETTING=VALUE with SETTING one of {sorted(fields)}"
            )
        old = getattr(current, name)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            if not isinstance(old, str):
                raise SystemExit(f"{flag} {item!r}: {text!r} is not a Python value") from None
            value = text
        number = (int, float)
        wrong_kind = (isinstance(old, bool) and not isinstance(value, bool)) or (
            isinstance(old, number)
            and not isinstance(old, bool)
            and (isinstance(value, bool) or not isinstance(value, number))
        )
        if wrong_kind:
            raise SystemExit(f"{flag} {item!r}: {name} is {old!r}, so give a value of that kind")
        changes[name] = value
    return changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--preset", choices=sorted(RECIPES), default=None, help="default: by device"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="the recipe's own schedule over fewer steps (smoke tests)",
    )
    parser.add_argument("--eval-batches", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--train",
        nargs="*",
        default=[],
        metavar="SETTING=VALUE",
        help="change the recipe's optimisation settings, e.g. --train lr=1e-3 'betas=(0.9, 0.95)' "
        "(a fitted recipe's max_steps, warm-up, evaluation and budget are the fit's)",
    )
    parser.add_argument(
        "--model",
        nargs="*",
        default=[],
        metavar="SETTING=VALUE",
        help="change the recipe's model, e.g. --model d_model=96 H=3",
    )
    parser.add_argument("--batch", type=int, default=None, help="windows a step (a study)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="fit the recipe's steps to this many seconds of training here (default: the budget of "
        "the cpu and minute presets, 120 and 60 s, on a CPU; none otherwise); 0: the recipe's own "
        "steps and budget",
    )
    args = parser.parse_args()
    if args.steps is not None and args.seconds:
        parser.error(
            "--steps runs the recipe's own schedule shortened; it cannot be fitted to --seconds"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    preset = args.preset or ("gpu" if device.type == "cuda" else "cpu")
    recipe = RECIPES[preset]
    if args.eval_batches:
        recipe = dataclasses.replace(recipe, eval_batches=args.eval_batches)
    if args.train:
        recipe = recipe.with_train(**settings("--train", args.train, recipe.train))
    studied = bool(args.train or args.model or args.batch or args.eval_batches)
    if args.batch:
        recipe = dataclasses.replace(recipe, batch_size=args.batch)
    if args.model:
        recipe = dataclasses.replace(
            recipe,
            model=dataclasses.replace(
                recipe.model, **settings("--model", args.model, recipe.model)
            ),
        )
    if device.type == "cuda":  # a script may set global switches; the library never does
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    print(f"machine: {machine(device)}")
    fit_seconds = args.seconds
    if (
        fit_seconds is None
        and args.steps is None
        and device.type == "cpu"
        and preset in FITTED_ON_CPU
    ):
        fit_seconds = recipe.train.time_budget_s
    step_seconds = None
    if fit_seconds:
        recipe, step_seconds = fit_to_time(recipe, fit_seconds, device)
        print(
            f"fitted to {fit_seconds:g} s: a step takes {step_seconds * 1e3:.1f} ms here, so "
            f"{recipe.train.max_steps} steps ({FIT_MARGIN:.0%}), {recipe.train.warmup_steps} of warm-up, "
            f"stopped after {recipe.train.time_budget_s:.1f} s if the machine slows down"
        )
    budget = fit_seconds or recipe.train.time_budget_s  # the time the run is measured against
    targeted = args.steps is None and not studied  # the preset as it is: its targets apply
    val_target = VAL_TARGETS.get((device.type, preset, budget)) if targeted else None
    recipe = recipe.with_steps(args.steps)
    print(f"recipe: {recipe}")
    run = train_char_lm(recipe, device, seed=recipe.train.seed)
    hist, model, tok = run.history, run.model, run.tokenizer
    print(f"model: {model.num_params():,} parameters")
    print(
        f"trained {hist.steps_done} steps in {hist.seconds:.1f} s; validation loss {run.val_loss:.4f}"
    )
    # a fitted run's guard stops a step short of its time; an unfitted run's loop stops after the
    # step that crosses its budget, which may end up to one step past it
    limit = (
        budget if step_seconds or not budget else round(budget + hist.seconds / hist.steps_done, 2)
    )
    B, C = recipe.batch_size, model.config.block_size
    tokens_per_s = hist.steps_done * B * C / hist.seconds
    flops = step_flops(model.config, B, C)["total"] * hist.steps_done / hist.seconds
    peak = bf16_dense_peak(device)
    mfu = flops / peak if peak else None
    print(
        f"throughput: {tokens_per_s:,.0f} tokens/s, {hist.seconds / hist.steps_done * 1e3:.1f} ms a step, "
        f"{flops / 1e12:.2f} TFLOP/s of model FLOPs (6 per matrix weight and token, attention's full "
        "square)"
        + (f", {mfu:.1%} of the card's {peak / 1e12:.0f} TFLOP/s bf16 dense peak" if mfu else "")
    )
    for s, v in zip(hist.eval_step, hist.evals["val_loss"], strict=True):
        print(f"  step {s:5d}: val {v:.4f}")

    prompt = torch.tensor([tok.encode("\n")], device=device)
    outputs, seconds = {}, {}
    for use_cache in (True, False):
        sync(device)
        t0 = time.perf_counter()
        outputs[use_cache] = generate(
            model, prompt, args.new_tokens, greedy=True, use_cache=use_cache
        )
        sync(device)
        seconds[use_cache] = time.perf_counter() - t0
    identical = torch.equal(outputs[True], outputs[False])
    print(
        f"greedy generation of {args.new_tokens} tokens: cached {seconds[True]:.2f} s, uncached "
        f"{seconds[False]:.2f} s, identical: {identical} (speed: bench/decode.py)"
    )
    print("sample:", tok.decode(outputs[True][0, 1:201].tolist()).replace("\n", " / "))
    report(
        {
            "targets": {
                **({"val_loss": ["<=", val_target]} if val_target else {}),
                **({"train_seconds": ["<=", limit]} if limit and args.steps is None else {}),
                "kv_identical": ["==", True],
            },
            "fitted_seconds": (fit_seconds if step_seconds else None),
            "probed_ms_per_step": round(step_seconds * 1e3, 3) if step_seconds else None,
            "preset": preset,
            "device": str(device),
            "machine": machine(device),
            "params": model.num_params(),
            "steps": hist.steps_done,
            "train_seconds": round(hist.seconds, 2),
            "train_settings": dataclasses.asdict(recipe.train),
            "model": dataclasses.asdict(model.config),
            "batch_size": B,
            "tokens_per_s": round(tokens_per_s, 1),
            "ms_per_step": round(hist.seconds / hist.steps_done * 1e3, 3),
            "model_tflops_per_s": round(flops / 1e12, 4),
            "bf16_dense_peak_tflops": peak / 1e12 if peak else None,
            "mfu": round(mfu, 4) if mfu else None,
            "val_loss": round(run.val_loss, 4),
            "val_loss_by_step": dict(zip(hist.eval_step, hist.evals["val_loss"], strict=True)),
            "kv_identical": identical,
        }
    )


if __name__ == "__main__":
    main()
