"""Language-model benchmark: train a character GPT on tiny-shakespeare, then time cached generation.

    python bench/lm.py                              # the CPU preset on the CPU (default)
    python bench/lm.py --device cuda --preset gpu   # nanoGPT's shakespeare_char size on a GPU

Trains within a time budget, reports the validation loss as the mean over a fixed set of held-out
batches (90/10 split), and times greedy generation of 500 new tokens with and without the key-value
cache (the tokens must be identical). Targets on a 2-core CPU: ``val_loss <= 1.70`` with
``train_seconds <= 120`` and ``kv_speedup >= 8``; on an H100 the GPU preset: ``val_loss <= 1.47`` in at
most 60 s. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import machine, report, sync

import transformer_course as tc
from transformer_course.data import get_batch, tinyshakespeare_text, train_val_split
from transformer_course.generate import generate
from transformer_course.models import GPT, SHAKESPEARE_CPU, SHAKESPEARE_GPU
from transformer_course.tokens import CharTokenizer
from transformer_course.train import TrainConfig, train

PRESETS = {
    "cpu": dict(
        model=SHAKESPEARE_CPU,
        train=TrainConfig(
            max_steps=1600, lr=5e-3, warmup_steps=100, weight_decay=0.1, eval_interval=400
        ),
        batch_size=48,
        budget_s=120.0,
        targets={
            "val_loss": ["<=", 1.70],
            "train_seconds": ["<=", 120],
            "kv_speedup": [">=", 8],
            "kv_identical": ["==", True],
        },
    ),
    "gpu": dict(
        model=SHAKESPEARE_GPU,
        train=TrainConfig(
            max_steps=3000, lr=2e-3, warmup_steps=100, weight_decay=0.1, eval_interval=500
        ),
        batch_size=64,
        budget_s=60.0,
        targets={
            "val_loss": ["<=", 1.47],
            "train_seconds": ["<=", 60],
            "kv_identical": ["==", True],
        },
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default=None, help="default: by device"
    )
    parser.add_argument("--steps", type=int, default=None, help="override the preset's step count")
    parser.add_argument("--eval-batches", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--kv-batches",
        type=int,
        nargs="*",
        default=[8, 48],
        help="also time generation for these numbers of prompts at once",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tc.default_device(args.device)
    preset = PRESETS[args.preset or ("gpu" if device.type == "cuda" else "cpu")]
    cfg = preset["train"]
    if args.steps:
        cfg = TrainConfig(**{**cfg.__dict__, "max_steps": args.steps})
    cfg = TrainConfig(**{**cfg.__dict__, "time_budget_s": preset["budget_s"]})
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = (
            True  # a script may set global switches; the library never does
        )
        torch.backends.cudnn.allow_tf32 = True

    tc.seed_everything(0)
    text = tinyshakespeare_text()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode_tensor(text))
    model = GPT(preset["model"]).to(device)
    C, B = model.config.block_size, preset["batch_size"]
    gen_val = torch.Generator().manual_seed(1234)
    val_batches = [get_batch(val_ids, C, B, gen_val, device) for _ in range(args.eval_batches)]

    def loss_fn(m, batch):
        return m(*batch)[1]

    def val_loss(m) -> float:
        return sum(loss_fn(m, b).item() for b in val_batches) / len(val_batches)

    print(f"machine: {machine(device)}")
    print(f"model: {model.config} ({model.num_params():,} parameters)")
    print(f"training: {cfg}, batch {B} x {C} tokens")
    hist = train(
        model,
        lambda g: get_batch(train_ids, C, B, g, device),
        loss_fn,
        cfg,
        val_loss,
        progress=False,
    )
    final = hist.eval_loss[-1]
    print(f"trained {hist.steps_done} steps in {hist.seconds:.1f} s; validation loss {final:.4f}")
    for s, v in zip(hist.eval_step, hist.eval_loss, strict=True):
        print(f"  step {s:5d}: val {v:.4f}")

    def time_generation(prompt: torch.Tensor, n_new: int) -> tuple[dict, dict]:
        timings, outputs = {}, {}
        for use_cache in (True, False):
            sync(device)
            t0 = time.perf_counter()
            outputs[use_cache] = generate(model, prompt, n_new, greedy=True, use_cache=use_cache)
            sync(device)
            timings[use_cache] = time.perf_counter() - t0
        return timings, outputs

    prompt = torch.tensor([tok.encode("\n")], device=device)
    timings, outputs = time_generation(prompt, args.new_tokens)
    identical = torch.equal(outputs[True], outputs[False])
    speedup = timings[False] / timings[True]
    print(
        f"greedy generation of {args.new_tokens} tokens: cached {timings[True]:.2f} s, "
        f"uncached {timings[False]:.2f} s, speed-up {speedup:.1f}x, identical: {identical}"
    )
    # One sequence is bound by per-operation overhead on a CPU; with many sequences per step the
    # uncached path's extra arithmetic shows. Prompts: the first character of held-out windows.
    by_batch = {}
    for batch in args.kv_batches:
        if batch > B:
            continue
        t, o = time_generation(val_batches[0][0][:batch, :1], args.new_tokens)
        by_batch[batch] = round(t[False] / t[True], 2)
        print(
            f"  batch of {batch:3d} prompts: cached {t[True]:.2f} s, uncached {t[False]:.2f} s, "
            f"speed-up {by_batch[batch]:.1f}x, identical: {torch.equal(o[True], o[False])}"
        )
    print("sample:", tok.decode(outputs[True][0, 1:201].tolist()).replace("\n", " / "))
    report(
        {
            "targets": preset["targets"],
            "preset": args.preset or ("gpu" if device.type == "cuda" else "cpu"),
            "device": str(device),
            "machine": machine(device),
            "params": model.num_params(),
            "steps": hist.steps_done,
            "train_seconds": round(hist.seconds, 2),
            "val_loss": round(final, 4),
            "kv_speedup": round(speedup, 2),
            "kv_identical": identical,
            "cached_seconds": round(timings[True], 3),
            "uncached_seconds": round(timings[False], 3),
            "kv_speedup_by_batch": by_batch,
        }
    )


if __name__ == "__main__":
    main()
