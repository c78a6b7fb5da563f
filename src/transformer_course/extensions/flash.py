"""Extensions: online softmax and tiled attention."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
from torch import Tensor

from ..self_attention import _check_qkv, _default_scale


def online_softmax(S: Tensor) -> Tensor:
    r"""Softmax over the last axis computed in one pass over the scores, book eq. ``eq-ext-online``
    (Milakov & Gimelshein 2018): a running maximum :math:`\mu_j` and a running sum :math:`\lambda_j`,

    .. math:: \mu_j = \max(\mu_{j-1}, s_j),\qquad
              \lambda_j = \lambda_{j-1}\, e^{\mu_{j-1} - \mu_j} + e^{s_j - \mu_j},\qquad
              \operatorname{softmax}(\mathbf{s})_j = e^{s_j - \mu_M} / \lambda_M

    with :math:`\mu_0 = -\infty`, :math:`\lambda_0 = 0`. A reference that reads like the recurrence: one
    Python step per score. ``S`` ``(..., M)``, any finite values.

    Implements: eq-ext-online
    """
    mu = torch.full(S.shape[:-1], float("-inf"), dtype=S.dtype, device=S.device)
    lam = torch.zeros(S.shape[:-1], dtype=S.dtype, device=S.device)
    for j in range(S.shape[-1]):
        mu_new = torch.maximum(mu, S[..., j])
        lam = lam * torch.exp(mu - mu_new) + torch.exp(S[..., j] - mu_new)  # rescale, then add
        mu = mu_new
    return torch.exp(S - mu[..., None]) / lam[..., None]


def tiled_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r"""Exact softmax attention computed block by block, book eq. ``eq-ext-tiled`` (the tiling of
    FlashAttention, Dao et al. 2022, written in PyTorch).

    For each block of ``block_q`` queries, the key blocks ``j`` update a running row maximum
    :math:`\mu`, a running sum :math:`\lambda` and an unnormalised output :math:`O`:

    .. math:: \mu' = \max(\mu, \operatorname{rowmax} S_j),\quad
              \lambda' = e^{\mu - \mu'}\lambda + \operatorname{rowsum} e^{S_j - \mu'},\quad
              O' = e^{\mu - \mu'} O + e^{S_j - \mu'} V_j,

    and the block's output is :math:`O / \lambda`. Only a ``block_q x block_k`` tile of scores exists at a
    time: the extra memory is :math:`O(N)` for :math:`\mu, \lambda` plus one tile, never ``N x M``.

    Args:
        Q: ``(..., N, d_k)``; K: ``(..., M, d_k)``; V: ``(..., M, d_v)``.
        causal: query ``n`` (the last ``N`` of ``M`` positions) sees keys up to its own position; key
            blocks wholly in its future are skipped.

    Returns:
        ``(..., N, d_v)``, equal to softmax attention up to rounding.

    Implements: eq-ext-tiled
    """
    _check_qkv(Q, K, V, None)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    N, M = Q.shape[-2], K.shape[-2]
    if causal and M < N:
        raise ValueError(f"causal attention needs M >= N keys, got N={N}, M={M}")
    scale = _default_scale(Q, scale)
    out = Q.new_empty(*Q.shape[:-1], V.shape[-1])  # (..., N, d_v)
    for i0 in range(0, N, block_q):
        i1 = min(i0 + block_q, N)
        q = Q[..., i0:i1, :] * scale  # (..., bq, d_k)
        mu = Q.new_full((*Q.shape[:-2], i1 - i0, 1), float("-inf"))  # running max
        lam = Q.new_zeros((*Q.shape[:-2], i1 - i0, 1))  # running sum
        O = Q.new_zeros((*Q.shape[:-2], i1 - i0, V.shape[-1]))  # unnormalised output
        last_key = i1 - 1 + M - N  # the latest key any query of this block may see
        for j0 in range(0, M if not causal else last_key + 1, block_k):
            j1 = min(j0 + block_k, M)
            S = q @ K[..., j0:j1, :].mT  # (..., bq, bk): one tile of scores
            if causal:  # the tile's own part of the causal mask: key m <= query's position
                q_pos = torch.arange(i0, i1, device=Q.device)[:, None] + (M - N)
                S = S.masked_fill(torch.arange(j0, j1, device=Q.device) > q_pos, float("-inf"))
            mu_new = torch.maximum(mu, S.amax(dim=-1, keepdim=True))
            base = torch.where(mu_new == float("-inf"), 0.0, mu_new)  # rows that saw no key yet
            P = torch.exp(S - base)  # (..., bq, bk)
            alpha = torch.exp(mu - base)  # rescales what was summed under the old maximum
            lam = alpha * lam + P.sum(dim=-1, keepdim=True)
            O = alpha * O + P @ V[..., j0:j1, :]
            mu = mu_new
        out[..., i0:i1, :] = O / lam
    return out


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's start and stop lines); Python exceptions still pass."""
    try:
        saved = os.dup(2)
    except OSError:  # no real descriptor (an unusual embedding): nothing to silence
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it, measured.

    On CUDA: ``torch.cuda.max_memory_allocated``. On the CPU: ``torch.profiler`` with
    ``profile_memory=True``, replaying every allocation and release it recorded in time order and
    taking the largest total. Inputs that exist before the call are not counted; its result is.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage  # > 0: allocated by this op; < 0: a release ("[memory]")
        peak = max(peak, live)
    return peak


def largest_intermediate(fn: Callable[[], object]) -> tuple[int, tuple[int, ...], str]:
    """The largest tensor any PyTorch operation produces while ``fn()`` runs: ``(bytes, shape, op)``.

    Counted, not measured: a dispatch mode sees the output of every ATen operation (inside composite
    ones too). For attention it names the tensor that sets the memory: the ``N x M`` scores when they
    are materialised.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    best: list = [0, (), ""]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, Tensor) and t.numel() * t.element_size() > best[0]:
                    best[:] = [t.numel() * t.element_size(), tuple(t.shape), str(func.__name__)]
            return out

    with Largest():
        fn()
    return best[0], best[1], best[2]
