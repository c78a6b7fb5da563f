"""Memory and FLOPs of one training step of the course's GPT, derived and measured.

Part of chapter *Training* (:mod:`transformer_course.training`; book eqs. ``eq-train-memory`` and
``eq-train-flops``; Kaplan et al. 2020 on the estimate ``C = 6 N D``). The derivations are for the
course's ``GPT`` (pre-norm blocks with biases, an MLP of width ``4D``, tied embeddings, float32, no
dropout); the measurements read what PyTorch itself does:

* :func:`saved_activation_bytes` counts the tensors autograd keeps for the backward pass
  (``torch.autograd.graph.saved_tensors_hooks``), each storage once;
* :func:`peak_step_memory` reads the allocations of a whole step from ``torch.profiler``
  (``profile_memory=True``) on the CPU, or ``torch.cuda.max_memory_allocated`` on a GPU;
* :func:`counted_flops` counts the FLOPs of a forward and backward pass with
  ``torch.utils.flop_counter.FlopCounterMode``, with attention on PyTorch's math backend: the fused CPU
  kernel that the model uses otherwise is not in the counter's table and would count as zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ..language_models import GPTConfig

__all__ = [
    "counted_flops",
    "gpt_params",
    "matmul_params",
    "peak_step_memory",
    "saved_activation_bytes",
    "step_flops",
    "step_memory",
]

FLOAT32 = 4  # bytes per number
INT64 = 8


def _check(cfg: GPTConfig) -> None:
    if cfg.dropout != 0:
        raise ValueError(
            f"the accounting is derived without dropout (each dropout layer keeps a mask for the "
            f"backward pass); got dropout={cfg.dropout}: use dataclasses.replace(cfg, dropout=0.0)"
        )


def gpt_params(cfg: GPTConfig) -> int:
    r"""The parameters of the course's GPT, :math:`|\theta|`: the token table :math:`|\mathcal{V}|D`
    (shared with the output layer when tied), the position table :math:`CD`, per block
    :math:`12D^2 + 13D` (the attention's four :math:`D\times D` maps and the MLP's two
    :math:`D\times 4D` maps with their biases, two LayerNorms) and the final LayerNorm :math:`2D`."""
    D, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    head = 0 if cfg.tie_weights else V * D
    return V * D + head + cfg.block_size * D + L * (12 * D * D + 13 * D) + 2 * D


def matmul_params(cfg: GPTConfig) -> int:
    r"""The parameters that enter a matrix product, :math:`|\theta_\text{mm}| = 12LD^2 +
    D|\mathcal{V}|`: the blocks' weight matrices and the output layer. Biases, LayerNorms and the
    position table are added or looked up, and the token table is looked up (it multiplies only as the
    tied output layer)."""
    D, L = cfg.d_model, cfg.n_layers
    return L * 12 * D * D + D * cfg.vocab_size


def step_flops(cfg: GPTConfig, B: int, N: int) -> dict[str, int]:
    r"""FLOPs of one training step (forward and backward) on ``B`` windows of ``N`` tokens, book eq.
    ``eq-train-flops``:

    .. math:: \mathcal{F}_\text{step} = 6BN|\theta_\text{mm}| + 12LBN^2D ,
              \qquad 6BN|\theta| \text{ (Kaplan et al.'s estimate)}

    A matrix product of an :math:`m\times k` by a :math:`k\times n` matrix costs :math:`2mkn` FLOPs
    forward and twice that backward (the gradients with respect to both factors), hence
    :math:`2 + 4 = 6` FLOPs per token and weight. Attention multiplies :math:`QK^\top` and
    :math:`AV`, :math:`2 \cdot 2N^2 D` FLOPs per window and block forward, counted over the whole
    :math:`N\times N` square (the causal half is not skipped by the math kernel).

    Implements: eq-train-flops

    Returns:
        ``{"matmul", "attention", "total", "six_n_d"}``.
    """
    matmul = 6 * B * N * matmul_params(cfg)
    attention = 12 * cfg.n_layers * B * N * N * cfg.d_model
    return {
        "matmul": matmul,
        "attention": attention,
        "total": matmul + attention,
        "six_n_d": 6 * gpt_params(cfg) * B * N,
    }


def step_memory(cfg: GPTConfig, B: int, N: int) -> dict[str, int]:
    r"""Bytes of one float32 training step with AdamW on ``B`` windows of ``N`` tokens, book eq.
    ``eq-train-memory``:

    .. math:: \mathcal{B}_\text{step} = \underbrace{4|\theta|}_{\theta}
              + \underbrace{4|\theta|}_{\mathbf{g}} + \underbrace{8|\theta|}_{\mathbf{m},\,\mathbf{c}}
              + \mathcal{B}_\text{act},\qquad
              \mathcal{B}_\text{act} \approx 4BN\,(16LD + 2D + |\mathcal{V}|)

    The activations are what autograd keeps for the backward pass. Per block and token, 16 numbers of
    width :math:`D`: the block's input and the first LayerNorm's output (:math:`2D`), the queries, keys
    and values (:math:`3D`), the attention's output (:math:`D`), the second LayerNorm's input and
    output (:math:`2D`), and the MLP's hidden layer before and after the GELU (:math:`2 \cdot 4D`).
    After the blocks, the final LayerNorm's input and output (:math:`2D`) and the log-probabilities of
    the loss (:math:`|\mathcal{V}|`). The count also holds the small terms the equation leaves out:
    two LayerNorm statistics per token and LayerNorm, the attention's log-sum-exp per token and head,
    the token ids, targets and positions (int64, the ids and targets in storages of their own: the
    windows of ``data.get_batch`` share one) and one number of the loss.

    Implements: eq-train-memory

    Returns:
        ``{"weights", "gradients", "adam", "activations", "total"}``.

    Raises:
        ValueError: ``cfg.dropout > 0`` (the dropout masks are not counted).
    """
    _check(cfg)
    D, L, H, V, T = cfg.d_model, cfg.n_layers, cfg.H, cfg.vocab_size, B * N
    p = gpt_params(cfg)
    per_block = 16 * T * D + (2 * 2 + H) * T  # + LayerNorm mean and 1/sigma, attention log-sum-exp
    after = (
        2 * T * D + 2 * T + T * V
    )  # final LayerNorm (input, output, statistics), log-probabilities
    ints = INT64 * (2 * T + N)  # token ids, targets, positions
    activations = FLOAT32 * (L * per_block + after + 1) + ints  # + 1: the loss's total weight
    out = {"weights": FLOAT32 * p, "gradients": FLOAT32 * p, "adam": 2 * FLOAT32 * p,
           "activations": activations}  # fmt: skip
    out["total"] = sum(out.values())
    return out


def saved_activation_bytes(model: nn.Module, run: Callable[[], Tensor]) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``run()`` computes a loss,
    each storage once and the parameters left out (they are counted as weights)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved.values())


def peak_step_memory(
    model: nn.Module, optimizer: torch.optim.Optimizer, run: Callable[[], Tensor]
) -> dict[str, int]:
    """Measure one training step: ``run()`` computes the loss, then its backward pass and
    ``optimizer.step()``, with the gradients freed before.

    Returns ``{"resident", "peak_above", "peak"}``: the bytes of the weights and of the optimiser's
    state held before the step (read from the tensors), the highest the allocations rose above that
    during the step (``torch.profiler`` on the CPU, ``torch.cuda.max_memory_allocated`` on a GPU), and
    their sum. Take one step before measuring, so that AdamW's moments exist.
    """
    optimizer.zero_grad(set_to_none=True)
    tensors = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, Tensor) and v.dim() > 0:
                tensors[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    resident = sum(tensors.values())
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run().backward()
        optimizer.step()
        torch.cuda.synchronize(device)
        peak_above = torch.cuda.max_memory_allocated(device) - base
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run().backward()
            optimizer.step()
        events = sorted(
            (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
            key=lambda e: e.start_ns(),
        )  # every allocation (+) and release (-), in order
        level = peak_above = 0
        for e in events:
            level += e.nbytes()
            peak_above = max(peak_above, level)
    return {"resident": resident, "peak_above": peak_above, "peak": resident + peak_above}


def counted_flops(run: Callable[[], Tensor], backward: bool = True) -> dict[str, int]:
    """FLOPs of ``run()`` (and of its loss's backward pass) as ``FlopCounterMode`` counts them, with
    attention on PyTorch's math backend (matrix products the counter sees). Returns the total and the
    count per operation (``"aten.mm"``, ``"aten.addmm"``, ``"aten.bmm"``)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = run()
        if backward:
            loss.backward()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    return {"total": int(counter.get_total_flops()), **by_op}
