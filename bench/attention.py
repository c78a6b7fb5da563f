"""Attention benchmark: the course's multi-head attention vs torch.nn.MultiheadAttention, fwd+bwd.

    python bench/attention.py                 # CPU (default)
    python bench/attention.py --device cuda   # a GPU
    python bench/attention.py --device cuda --dtype bfloat16 --N 1024 --D 768 --H 12   # GPT-2 small

Times forward + backward of ``tc.multihead.SelfAttention`` and ``torch.nn.MultiheadAttention``
(``batch_first=True``, ``need_weights=False``, identical weights) at B=8, N=256, D=256, H=8, in one
process, alternating the two, and reports the ratio of medians (course / torch; target <= 0.80 on CPU).
A third contender is the layer a user writes on ``F.scaled_dot_product_attention`` (``bench/baselines.py``;
target: course / it <= 1.1). ``--dtype bfloat16`` runs all three with bfloat16 weights and inputs.
Also reports the largest absolute difference between the reference and efficient single-head paths in
float32 (target <= 1e-5) and between the multi-head reference (a loop over heads) and the module.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse

import torch
from baselines import SDPASelfAttention
from common import interleaved_medians, report
from torch import nn

import transformer_course as tc
from transformer_course.multihead import SelfAttention, multi_head_attention_reference
from transformer_course.runtime import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--N", type=int, default=256)
    parser.add_argument("--D", type=int, default=256)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    device = tc.default_device(args.device)
    B, N, D, H = args.B, args.N, args.D, args.H
    tc.seed_everything(0)

    ours = SelfAttention(D, H).to(device)
    theirs = nn.MultiheadAttention(D, H, batch_first=True).to(device)
    ours.load_from_torch(theirs)
    sdpa = SDPASelfAttention(D, H).to(device)
    with torch.no_grad():  # the same weights in all three
        sdpa.qkv.weight.copy_(ours.in_proj.weight)
        sdpa.qkv.bias.copy_(ours.in_proj.bias)
        sdpa.proj.weight.copy_(ours.out_proj.weight)
        sdpa.proj.bias.copy_(ours.out_proj.bias)
    ours, theirs, sdpa = (m.to(dtype) for m in (ours, theirs, sdpa))
    X = torch.randn(B, N, D, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, N, D, device=device, dtype=dtype)
    with torch.no_grad():
        agree = (ours(X) - sdpa(X)).abs().max().item()  # the same layer: rounding differences only

    def step_ours() -> None:
        ours(X).backward(grad)

    def step_torch() -> None:
        theirs(X, X, X, need_weights=False)[0].backward(grad)

    def step_sdpa() -> None:
        sdpa(X).backward(grad)

    def step_torch_weights() -> None:  # torch's default returns the averaged weights too
        theirs(X, X, X)[0].backward(grad)

    med = interleaved_medians(
        {
            "course": step_ours,
            "torch": step_torch,
            "sdpa": step_sdpa,
            "torch_need_weights": step_torch_weights,
        },
        device,
        args.repeats,
    )
    ratio = med["course"] / med["torch"]
    ratio_sdpa = med["course"] / med["sdpa"]

    with torch.no_grad():  # the references in float32, whatever --dtype timed
        ours, X = ours.float(), X.float()
        Xs = X.detach()
        W_q, W_k, W_v = (torch.randn(D, D // H, device=device) / D**0.5 for _ in range(3))
        single_ref = tc.self_attention.single_head_reference(Xs, W_q, W_k, W_v)
        single_eff = tc.self_attention.single_head(Xs, W_q, W_k, W_v)
        err_single = (single_ref - single_eff).abs().max().item()
        # the reference has no biases: compare with a bias-free copy of the module instead
        plain = SelfAttention(D, H, bias=False).to(device)
        plain.in_proj.weight.copy_(ours.in_proj.weight)
        plain.out_proj.weight.copy_(ours.out_proj.weight)
        err_multi = (
            (multi_head_attention_reference(Xs, **plain.weights, H=H) - plain(Xs))
            .abs()
            .max()
            .item()
        )

    print(f"machine: {machine(device)}")
    print(f"shape: B={B} N={N} D={D} H={H}, {args.dtype}, forward+backward, {args.repeats} repeats")
    print(f"course SelfAttention           : {med['course'] * 1e3:8.2f} ms (median)")
    print(f"torch nn.MultiheadAttention    : {med['torch'] * 1e3:8.2f} ms (need_weights=False)")
    print(
        f"torch, need_weights=True       : {med['torch_need_weights'] * 1e3:8.2f} ms (its default)"
    )
    print(f"layer on F.scaled_dot_product_attention: {med['sdpa'] * 1e3:8.2f} ms")
    print(f"ratio course / torch           : {ratio:.3f} (target <= 0.80)")
    print(f"ratio course / SDPA layer      : {ratio_sdpa:.3f} (target <= 1.1)")
    print(f"max |course - SDPA layer|      : {agree:.2e} ({args.dtype}, forward)")
    print(
        f"max |reference - efficient|    : single head {err_single:.2e}, multi-head {err_multi:.2e}"
    )
    report(
        {
            "targets": {
                "mhsa_vs_torch_ratio": ["<=", 0.80],
                "mhsa_vs_sdpa_ratio": ["<=", 1.1],
                "reference_max_abs_err_fp32": ["<=", 1e-5],
            },
            "device": str(device),
            "machine": machine(device),
            "shape": {"B": B, "N": N, "D": D, "H": H},
            "dtype": args.dtype,
            "sdpa_ms": round(med["sdpa"] * 1e3, 3),
            "mhsa_vs_sdpa_ratio": round(ratio_sdpa, 4),
            "course_vs_sdpa_max_abs_diff": agree,
            "course_ms": round(med["course"] * 1e3, 3),
            "torch_ms": round(med["torch"] * 1e3, 3),
            "torch_need_weights_ms": round(med["torch_need_weights"] * 1e3, 3),
            "mhsa_vs_torch_ratio": round(ratio, 4),
            "reference_max_abs_err_fp32": err_single,
            "multihead_reference_max_abs_err_fp32": err_multi,
        }
    )


if __name__ == "__main__":
    main()
