"""Decoding benchmark: cached generation against Hugging Face and against the memory bound.

    python bench/decode.py                     # CPU, 2 threads (default)
    python bench/decode.py --device cuda

A model of nanoGPT's ``shakespeare_char`` size (6 layers, 6 heads, width 384, context 256, vocabulary
65; random weights, dropout off) generates 200 tokens greedily after a 16-token prompt. Reported, best
of ``--repeats`` runs after a warm-up:

* tokens/s (the best run; the median is recorded too) of the course's cached decoding
  (``tc.language_models.generate``) and of Hugging Face ``transformers``' ``GPT2LMHeadModel`` of the
  same sizes (``generate(use_cache=True, do_sample=False)``), alternating in one run. Target:
  ``speed_vs_hf >= 1.5``.
* the weight-streaming bound: the time of one matrix-vector product over a single matrix holding as
  many bytes as all the model's weights. A generated token must read every weight once, so no decoder
  can beat it at batch 1. Target: ``ms_per_token / bound_ms <= 2``.
* the machine's matrix-multiply peak (a large square product), for the roofline picture of chapter 7;
* where a token's time goes: the profiler's table of the course's cached decoding per token, and the
  time spent outside every PyTorch operation (Python, dispatch, the profiler's bookkeeping);
* at batch 8 and 48 (``--batches``): tokens/s with and without the cache and the cache's speed-up over
  ``--sweep-tokens`` new tokens, whether the tokens are identical, and Hugging Face's cached tokens/s;
* training: steps/s of the course's GPT at this size (dropout 0.2, as the preset) against a minimal
  nanoGPT-style model (``bench/baselines.py``) of the same sizes, same batch. Target:
  ``train_speed_vs_nanogpt >= 0.97`` (equal within this measurement's few-percent noise).

``transformers`` is a benchmark-only dependency: ``pip install -e '.[bench]'``. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from baselines import NanoGPT, hf_gpt2
from common import interleaved_times, report, sync

import transformer_course as tc
from transformer_course.language_models import GPT, SHAKESPEARE_GPU, generate
from transformer_course.runtime import machine
from transformer_course.train import TrainConfig, make_optimizer


def timed(fn, device: torch.device, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    return min(timed(fn, device, repeats))


def streaming_bound_seconds(n_params: int, d: int, device: torch.device, repeats: int) -> float:
    """Best time of one matrix-vector product whose matrix has ``n_params`` float32 entries."""
    W = torch.randn(n_params // d, d, device=device)
    x = torch.randn(d, device=device)
    return best_seconds(lambda: torch.mv(W, x), device, max(repeats, 20))


def per_token_profile(run, n_new: int, device: torch.device, rows: int = 10) -> dict:
    """Where a generated token's time goes: ``torch.profiler`` over one call of ``run`` (a generation
    of ``n_new`` tokens), each PyTorch operation's self time on the CPU and calls per token, the
    ``rows`` largest; the wall time per token with the profiler on; and the part of it spent outside
    every operation (Python, the modules' calls, part of PyTorch's dispatch, and the profiler's own
    bookkeeping). The profiler's cost per operation inflates the small ones, so the wall time with it
    on is reported beside the timed figure. On a GPU the times are the CPU's side only: launching the
    kernels, not running them."""
    from torch.profiler import ProfilerActivity, profile

    run()  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sync(device)
        t0 = time.perf_counter()
        run()
        sync(device)
        wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    in_ops_us = sum(e.self_cpu_time_total for e in events) / n_new  # microseconds
    return {
        "ms_per_token_profiled": round(wall / n_new * 1e3, 4),
        "ms_per_token_in_ops": round(in_ops_us / 1e3, 4),
        "ms_per_token_outside_ops": round(wall / n_new * 1e3 - in_ops_us / 1e3, 4),
        "ops": [
            {
                "op": e.key,
                "calls_per_token": round(e.count / n_new, 2),
                "us_per_token": round(e.self_cpu_time_total / n_new, 1),
            }
            for e in events[:rows]
        ],
    }


def matmul_peak_flops(device: torch.device, n: int = 2048) -> float:
    """FLOP/s of a large float32 square matrix product (best of five)."""
    A, B = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n**3 / best_seconds(lambda: A @ B, device, 5)


def train_steps_per_second(
    models: dict[str, torch.nn.Module], batch: int, context: int, device, repeats: int
) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 65, (batch, context), generator=g).to(device) for _ in range(2))
    steps = {}
    for name, model in models.items():
        model.train()
        opt = make_optimizer(model, TrainConfig())

        def step(model=model, opt=opt) -> None:
            loss = model(x, y)[1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        steps[name] = step
    times = interleaved_times(steps, device, repeats, warmup=2)
    return {name: [1 / t for t in ts] for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="*", default=[8, 48])
    parser.add_argument("--sweep-tokens", type=int, default=64, help="new tokens in the sweep")
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--train-repeats", type=int, default=10)
    parser.add_argument(
        "--layers", type=int, default=SHAKESPEARE_GPU.n_layers, help="(smoke tests)"
    )
    args = parser.parse_args()
    device = tc.default_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    c = dataclasses.replace(SHAKESPEARE_GPU, n_layers=args.layers, dropout=0.0)
    sizes = (c.vocab_size, c.block_size, c.n_layers, c.H, c.d_model)
    tc.seed_everything(0)
    ours = GPT(c).to(device).eval()
    hf = hf_gpt2(*sizes).to(device)
    prompt = torch.randint(0, c.vocab_size, (1, args.prompt), device=device)
    n_new = args.new_tokens

    def run_ours() -> torch.Tensor:
        return generate(ours, prompt, n_new, greedy=True)

    def run_hf() -> torch.Tensor:
        with torch.inference_mode():
            return hf.generate(
                prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, use_cache=True
            )

    assert run_ours().shape[1] == run_hf().shape[1] == args.prompt + n_new
    times = {"course": [], "hf": []}
    for _ in range(args.repeats):  # alternate the two, so that drift on the machine hits both
        times["course"] += timed(run_ours, device, 1)
        times["hf"] += timed(run_hf, device, 1)
    t_ours, t_hf = min(times["course"]), min(times["hf"])
    median = {name: statistics.median(ts) for name, ts in times.items()}
    ms_per_token = t_ours / n_new * 1e3
    bound_ms = streaming_bound_seconds(ours.num_params(), c.d_model, device, args.repeats) * 1e3
    peak = matmul_peak_flops(device)
    weight_bytes = 4 * ours.num_params()
    print(f"machine: {machine(device)}")
    print(f"model: {c} ({ours.num_params():,} parameters, {weight_bytes / 1e6:.1f} MB in float32)")
    print(
        f"batch 1, {args.prompt}-token prompt, {n_new} new tokens, greedy, best of {args.repeats}:"
    )
    print(f"  course (KV cache)     {n_new / t_ours:7.1f} tokens/s   {ms_per_token:6.3f} ms/token")
    print(
        f"  Hugging Face GPT-2    {n_new / t_hf:7.1f} tokens/s   {t_hf / n_new * 1e3:6.3f} ms/token"
    )
    print(f"  speed vs Hugging Face {t_hf / t_ours:.2f}x (target >= 1.5)")
    print(
        f"weight-streaming bound: one mat-vec over {weight_bytes / 1e6:.1f} MB takes {bound_ms:.3f} ms "
        f"({weight_bytes / bound_ms / 1e6:.1f} GB/s); course / bound = {ms_per_token / bound_ms:.2f} "
        "(target <= 2)"
    )
    print(f"matrix-multiply peak: {peak / 1e9:.1f} GFLOP/s (2048 x 2048 float32)")
    profiled = per_token_profile(run_ours, n_new, device)
    print(
        f"profile of the course's cached decoding, per token: {profiled['ms_per_token_profiled']:.3f} "
        f"ms with the profiler on, {profiled['ms_per_token_in_ops']:.3f} ms inside PyTorch operations, "
        f"{profiled['ms_per_token_outside_ops']:.3f} ms outside them; the largest:"
    )
    for row in profiled["ops"]:
        print(
            f"  {row['op']:32s} {row['calls_per_token']:6.2f} calls {row['us_per_token']:8.1f} us"
        )

    sweep = {}
    for B in args.batches:
        prompts = torch.randint(0, c.vocab_size, (B, args.prompt), device=device)
        outs, secs = {}, {}
        for use_cache in (True, False):
            secs[use_cache] = best_seconds(
                lambda p=prompts, u=use_cache, o=outs: o.__setitem__(
                    u, generate(ours, p, args.sweep_tokens, greedy=True, use_cache=u)
                ),
                device,
                args.repeats if use_cache else 1,  # uncached is slow: one timed run
            )
        with torch.inference_mode():
            secs["hf"] = best_seconds(
                lambda p=prompts: hf.generate(
                    p,
                    max_new_tokens=args.sweep_tokens,
                    min_new_tokens=args.sweep_tokens,
                    do_sample=False,
                    use_cache=True,
                ),
                device,
                args.repeats,
            )
        tokens = B * args.sweep_tokens
        sweep[B] = {
            "cached_tokens_per_s": round(tokens / secs[True], 1),
            "uncached_tokens_per_s": round(tokens / secs[False], 1),
            "hf_cached_tokens_per_s": round(tokens / secs["hf"], 1),
            "cache_speedup": round(secs[False] / secs[True], 2),
            "identical": torch.equal(outs[True], outs[False]),
        }
        print(
            f"batch {B:3d}, {args.sweep_tokens} new tokens: cached {tokens / secs[True]:8.1f} "
            f"tokens/s, uncached {tokens / secs[False]:8.1f} tokens/s, speed-up "
            f"{sweep[B]['cache_speedup']:.2f}x, identical: {sweep[B]['identical']}; Hugging Face "
            f"cached {tokens / secs['hf']:8.1f} tokens/s"
        )
    identical_b1 = torch.equal(
        run_ours(), generate(ours, prompt, n_new, greedy=True, use_cache=False)
    )

    train_cfg = dataclasses.replace(c, dropout=SHAKESPEARE_GPU.dropout)
    tc.seed_everything(0)
    train_models = {
        "course": GPT(train_cfg).to(device),
        "nanogpt": NanoGPT(*sizes, p=train_cfg.dropout).to(device),
    }
    rates = train_steps_per_second(
        train_models, args.train_batch, c.block_size, device, args.train_repeats
    )
    med = {name: statistics.median(r) for name, r in rates.items()}
    spread = {name: (max(r) - min(r)) / statistics.median(r) for name, r in rates.items()}
    train_ratio = med["course"] / med["nanogpt"]
    print(
        f"training, batch {args.train_batch} x {c.block_size} tokens, dropout {train_cfg.dropout}, "
        f"median of {args.train_repeats}: course {med['course']:.3f} steps/s, nanoGPT-style "
        f"{med['nanogpt']:.3f} steps/s, ratio {train_ratio:.3f} (target >= 0.97; spread of the "
        f"repeats {max(spread.values()):.1%})"
    )
    report(
        {
            "targets": {
                "speed_vs_hf": [">=", 1.5],
                "bound_ratio": ["<=", 2.0],
                "identical": ["==", True],
                "train_speed_vs_nanogpt": [">=", 0.97],
            },
            "device": str(device),
            "machine": machine(device),
            "model": dataclasses.asdict(c),
            "params": ours.num_params(),
            "weight_bytes": weight_bytes,
            "new_tokens": n_new,
            "prompt_tokens": args.prompt,
            "tokens_per_s": round(n_new / t_ours, 1),
            "hf_tokens_per_s": round(n_new / t_hf, 1),
            "ms_per_token": round(ms_per_token, 4),
            "hf_ms_per_token": round(t_hf / n_new * 1e3, 4),
            "median_ms_per_token": round(median["course"] / n_new * 1e3, 4),
            "median_hf_ms_per_token": round(median["hf"] / n_new * 1e3, 4),
            "repeats": args.repeats,
            "speed_vs_hf": round(t_hf / t_ours, 3),
            "bound_ms": round(bound_ms, 4),
            "bound_gb_per_s": round(weight_bytes / bound_ms / 1e6, 2),
            "bound_ratio": round(ms_per_token / bound_ms, 3),
            "matmul_gflops": round(peak / 1e9, 1),
            "profile_per_token": profiled,
            "identical": identical_b1 and all(s["identical"] for s in sweep.values()),
            "sweep_new_tokens": args.sweep_tokens,
            "by_batch": sweep,
            "train_batch": args.train_batch,
            "train_steps_per_s": round(med["course"], 4),
            "nanogpt_train_steps_per_s": round(med["nanogpt"], 4),
            "train_speed_vs_nanogpt": round(train_ratio, 4),
            "train_spread": round(max(spread.values()), 4),
        }
    )


if __name__ == "__main__":
    main()
