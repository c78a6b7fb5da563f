"""Masked-LM benchmark: a character MLM and the causal GPT, same budget, on a gap and a continuation.

    python bench/mlm.py                     # the CPU recipes on the CPU (default)
    python bench/mlm.py --steps 20          # a smoke test

Trains the chapter's masked language model (``MLM_CPU_RECIPE``, run by
``tc.masked.train_char_mlm``) and the causal GPT of chapter 7 (``SHAKESPEARE_CPU_RECIPE``, run by
``tc.language_models.train_char_lm``) for the same number of steps on the same windows per step (their
wall-clock budgets lifted, so a loaded machine cannot cut one run shorter than the other). Then, on the
same held-out windows of 64 characters, both predict the character at position 32:

* the GPT from the 32 characters to its left (all it can see);
* the MLM from those 32 characters and the first ``k`` characters to its right, the character itself
  and the rest of the window being ``[MASK]``: ``k = 31`` fills a gap, ``k = 0`` continues a text.

It reports the mean negative log-likelihood (nats) and the arg-max accuracy of each, as a curve over
``k``. Targets: the MLM uses the right side (``right_context_gain_nats``, its loss at ``k = 0`` minus
its loss at ``k = 31``, is positive) and loses to the GPT on the continuation
(``continuation_loss_nats > 0``). ``gap_gain_nats`` (the GPT's loss minus the MLM's at ``k = 31``) is
reported without a target: on an equal budget of steps the MLM has scored about 0.15 as many targets,
and which of the two wins the gap depends on the budget. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

import transformer_course as tc
from transformer_course.data import get_batch
from transformer_course.language_models import SHAKESPEARE_CPU_RECIPE, train_char_lm
from transformer_course.masked import MLM_CPU_RECIPE, lm_scores, mlm_scores, train_char_mlm
from transformer_course.runtime import machine

POSITION = 32  # the predicted character: 32 characters on its left, 31 on its right
RIGHTS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 31)  # characters visible to its right (MLM only)
TARGETS = {"right_context_gain_nats": [">=", 0.1], "continuation_loss_nats": [">=", 0.1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="fewer steps (smoke tests)")
    parser.add_argument("--windows", type=int, default=2048, help="held-out windows scored")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    steps = args.steps or MLM_CPU_RECIPE.train.max_steps
    if steps > SHAKESPEARE_CPU_RECIPE.train.max_steps:
        raise SystemExit(f"--steps {steps} exceeds the GPT recipe's {steps}")
    mlm_recipe = MLM_CPU_RECIPE.with_train(time_budget_s=None)
    gpt_recipe = SHAKESPEARE_CPU_RECIPE.with_train(time_budget_s=None)
    print(f"machine: {machine(device)}")
    print(f"MLM recipe: {mlm_recipe.with_steps(steps)}")
    print(f"GPT recipe: {gpt_recipe.with_steps(steps)}")

    t0 = time.perf_counter()
    mlm = train_char_mlm(mlm_recipe, device, seed=0, steps=steps)
    mlm_seconds = time.perf_counter() - t0
    print(
        f"MLM: {mlm.history.steps_done} steps in {mlm_seconds:.1f} s, val loss {mlm.val_loss:.4f}"
    )
    t0 = time.perf_counter()
    gpt = train_char_lm(gpt_recipe, device, steps=steps, seed=0)
    gpt_seconds = time.perf_counter() - t0
    print(
        f"GPT: {gpt.history.steps_done} steps in {gpt_seconds:.1f} s, val loss {gpt.val_loss:.4f}"
    )

    C = mlm.model.config.block_size
    windows = get_batch(mlm.val_ids, C, args.windows, torch.Generator().manual_seed(4321))[0]
    windows = windows.to(device)
    g_nll, g_ok = lm_scores(gpt.model, windows, POSITION)
    gpt_nll, gpt_acc = g_nll.mean().item(), g_ok.double().mean().item()
    curve = {}
    for k in RIGHTS:
        nll, ok = mlm_scores(mlm.model, windows, POSITION, k, mlm.mask_id)
        curve[k] = (nll.mean().item(), ok.double().mean().item())
    print(f"position {POSITION} of {args.windows} held-out windows of {C} characters:")
    print(f"  GPT, left side only:          nll {gpt_nll:.4f} nats, accuracy {gpt_acc:.4f}")
    for k, (nll, acc) in curve.items():
        print(f"  MLM, left + {k:2d} on the right: nll {nll:.4f} nats, accuracy {acc:.4f}")

    tok = mlm.tokenizer
    for b in range(4):  # a few gaps, shown as text
        w = windows[b : b + 1]
        x = w.clone()
        x[0, POSITION] = mlm.mask_id
        with torch.no_grad():
            m_pred = mlm.model.eval()(x)[0][0, POSITION].argmax().item()
            g_pred = gpt.model.eval()(w[:, :POSITION])[0][0, -1].argmax().item()
        text = tok.decode(w[0].tolist())
        shown = (text[:POSITION] + "_" + text[POSITION + 1 :]).replace("\n", "/")
        print(
            f"  {shown!r}: true {text[POSITION]!r}, MLM {tok.decode([m_pred])!r}, "
            f"GPT {tok.decode([g_pred])!r}"
        )

    gap, cont = curve[RIGHTS[-1]], curve[0]
    report(
        {
            "targets": TARGETS,
            "right_context_gain_nats": round(cont[0] - gap[0], 4),
            "gap_gain_nats": round(gpt_nll - gap[0], 4),
            "continuation_loss_nats": round(cont[0] - gpt_nll, 4),
            "gpt_nll": round(gpt_nll, 4),
            "gpt_accuracy": round(gpt_acc, 4),
            "mlm_nll_by_right": {str(k): round(v[0], 4) for k, v in curve.items()},
            "mlm_accuracy_by_right": {str(k): round(v[1], 4) for k, v in curve.items()},
            "position": POSITION,
            "block_size": C,
            "windows": args.windows,
            "steps": steps,
            "batch_size": mlm_recipe.batch_size,
            "p": mlm_recipe.p,
            "mlm_val_loss": round(mlm.val_loss, 4),
            "gpt_val_loss": round(gpt.val_loss, 4),
            "mlm_train_seconds": round(mlm_seconds, 1),
            "gpt_train_seconds": round(gpt_seconds, 1),
            "device": device.type,
            "machine": machine(device),
        }
    )


if __name__ == "__main__":
    main()
