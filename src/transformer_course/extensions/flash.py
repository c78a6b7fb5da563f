"""Extensions: online softmax, tiled attention, its backward pass and its memory traffic."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
from torch import Tensor

from ..self_attention import _check_qkv, _default_scale


def online_softmax(S: Tensor) -> Tensor:
    r"""Softmax over the last axis computed in one pass over the scores, book eq. ``eq-ext-online``
    (Milakov & Gimelshein 2018): for each row ``n``, the maximum :math:`\mu_{n,m}` of its first ``m``
    scores and the sum :math:`\lambda_{n,m}` of their exponentials relative to it,

    .. math:: \mu_{n,m} = \max(\mu_{n,m-1}, S_{nm}),\qquad
              \lambda_{n,m} = \lambda_{n,m-1}\, e^{\mu_{n,m-1} - \mu_{n,m}} + e^{S_{nm} - \mu_{n,m}},
              \qquad A_{nm} = e^{S_{nm} - \mu_{n,M}} / \lambda_{n,M}

    with :math:`\mu_{n,0} = -\infty`, :math:`\lambda_{n,0} = 0`. A reference that reads like the
    recurrence: one Python step per score. ``S`` ``(..., M)``, any finite values.

    Implements: eq-ext-online
    """
    mu = torch.full(S.shape[:-1], float("-inf"), dtype=S.dtype, device=S.device)
    lam = torch.zeros(S.shape[:-1], dtype=S.dtype, device=S.device)
    for j in range(S.shape[-1]):
        mu_new = torch.maximum(mu, S[..., j])
        lam = lam * torch.exp(mu - mu_new) + torch.exp(S[..., j] - mu_new)  # rescale, then add
        mu = mu_new
    return torch.exp(S - mu[..., None]) / lam[..., None]


class IOCounter:
    """Tally of the numbers (elements, not bytes) a tiled loop reads from and writes to main memory.

    The instrumented loops call :meth:`load` on every block they bring into fast memory and
    :meth:`store` on every block they send back; both return the tensor unchanged, so the counting
    wraps the very code that computes. ``reads`` and ``writes`` are element counts.
    """

    def __init__(self) -> None:
        self.reads = 0
        self.writes = 0

    def load(self, t: Tensor) -> Tensor:
        self.reads += t.numel()
        return t

    def store(self, t: Tensor) -> Tensor:
        self.writes += t.numel()
        return t

    def __repr__(self) -> str:
        return f"IOCounter(reads={self.reads}, writes={self.writes})"


def _check_blocks(block_q: int, block_k: int) -> None:
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"block sizes must be positive ints (rows per tile), got {name}={b!r}")


def _check_causal(N: int, M: int, causal: bool) -> None:
    if causal and M < N:
        raise ValueError(
            f"causal attention needs M >= N keys (the queries are the last N of M positions), "
            f"got N={N}, M={M}"
        )


def tiled_attention_forward(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
    io: IOCounter | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The loop of :func:`tiled_attention`, returning what the backward pass needs: the output ``Y``
    ``(..., N, d_v)`` and the row log-sum-exp ``rho`` ``(..., N)`` (the one statistic FlashAttention-2,
    Dao 2024, keeps per row), book eq. ``eq-ext-lse``,
    :math:`\rho_n = \log \sum_m e^{S_{nm}} = \mu_{n,M} + \log \lambda_{n,M}` from the running statistics
    at the end of each row. Arguments as :func:`tiled_attention`.

    Implements: eq-ext-lse
    """
    _check_qkv(Q, K, V, None)
    _check_blocks(block_q, block_k)
    N, M = Q.shape[-2], K.shape[-2]
    _check_causal(N, M, causal)
    scale = _default_scale(Q, scale)
    io = io or IOCounter()
    out = Q.new_empty(*Q.shape[:-1], V.shape[-1])  # (..., N, d_v)
    lse = Q.new_empty(Q.shape[:-1])  # (..., N): rho = mu + log(lambda), all the backward needs
    for i0 in range(0, N, block_q):
        i1 = min(i0 + block_q, N)
        q = io.load(Q[..., i0:i1, :]) * scale  # (..., bq, d_k)
        mu = Q.new_full((*Q.shape[:-2], i1 - i0, 1), float("-inf"))  # running max
        lam = Q.new_zeros((*Q.shape[:-2], i1 - i0, 1))  # running sum
        Y_tilde = Q.new_zeros((*Q.shape[:-2], i1 - i0, V.shape[-1]))  # unnormalised output
        last_key = i1 - 1 + M - N  # the latest key any query of this block may see
        for j0 in range(0, M if not causal else last_key + 1, block_k):
            j1 = min(j0 + block_k, M)
            S = q @ io.load(K[..., j0:j1, :]).mT  # (..., bq, bk): one tile of scores
            if causal:  # the tile's own part of the causal mask: key m <= query's position
                q_pos = torch.arange(i0, i1, device=Q.device)[:, None] + (M - N)
                S = S.masked_fill(torch.arange(j0, j1, device=Q.device) > q_pos, float("-inf"))
            mu_new = torch.maximum(mu, S.amax(dim=-1, keepdim=True))
            base = torch.where(mu_new == float("-inf"), 0.0, mu_new)  # rows that saw no key yet
            P = torch.exp(S - base)  # (..., bq, bk)
            alpha = torch.exp(mu - base)  # rescales what was summed under the old maximum
            lam = alpha * lam + P.sum(dim=-1, keepdim=True)
            Y_tilde = alpha * Y_tilde + P @ io.load(V[..., j0:j1, :])
            mu = mu_new
        out[..., i0:i1, :] = io.store(Y_tilde / lam)
        lse[..., i0:i1] = io.store((mu + torch.log(lam)).squeeze(-1))
    return out, lse


def tiled_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
    io: IOCounter | None = None,
) -> Tensor:
    r"""Exact softmax attention computed block by block, book eq. ``eq-ext-tiled`` (the tiling of
    FlashAttention, Dao et al. 2022, written in PyTorch).

    For each block of ``block_q`` queries, the key blocks ``j`` update a running row maximum
    :math:`\mu`, a running sum :math:`\lambda` and an unnormalised output :math:`\tilde Y`:

    .. math:: \mu' = \max(\mu, \operatorname{rowmax} S_j),\quad
              \lambda' = e^{\mu - \mu'}\lambda + \operatorname{rowsum} e^{S_j - \mu'},\quad
              \tilde Y' = e^{\mu - \mu'} \tilde Y + e^{S_j - \mu'} V_j,

    and the block's output is :math:`\tilde Y / \lambda`. Only a ``block_q x block_k`` tile of scores
    exists at a time: the extra memory is :math:`O(N)` for :math:`\mu, \lambda` plus one tile, never
    ``N x M``.

    Args:
        Q: ``(..., N, d_k)``; K: ``(..., M, d_k)``; V: ``(..., M, d_v)``.
        causal: query ``n`` (the last ``N`` of ``M`` positions) sees keys up to its own position; key
            blocks wholly in its future are skipped.
        io: an :class:`IOCounter` that tallies every block read from and written to main memory
            (book eq. ``eq-ext-io``).

    Returns:
        ``(..., N, d_v)``, equal to softmax attention up to rounding. For gradients by the tiled
        backward pass, use :func:`tiled_attention_with_grad`.

    Implements: eq-ext-tiled
    """
    return tiled_attention_forward(Q, K, V, block_q, block_k, causal, scale, io)[0]


def tiled_attention_backward(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    Y: Tensor,
    rho: Tensor,
    dY: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
    io: IOCounter | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Gradients of tiled attention from what the forward kept, book eq. ``eq-ext-flash-bwd``
    (the backward pass of FlashAttention, Dao et al. 2022, sec. 3.1 and app. B).

    The forward stores only the output ``Y`` and the row log-sum-exp ``rho`` (eq. ``eq-ext-lse``).
    First :math:`\delta_n = d\mathbf{y}_n \cdot \mathbf{y}_n` for every query; then, for each key tile
    ``t`` of ``block_k`` keys (outer loop) and each query tile ``a`` of ``block_q`` queries (inner loop),
    the tile's weights are recomputed, :math:`A = e^{S - \rho}` with :math:`S = c\, Q_a K_t^\top` (``c``
    the scale), and

    .. math:: dV_t \mathrel{+}= A^\top dY_a,\quad dA = dY_a V_t^\top,\quad
              dS = A \odot (dA - \delta_a),\quad dQ_a \mathrel{+}= c\, dS\, K_t,\quad
              dK_t \mathrel{+}= c\, dS^\top Q_a .

    Args:
        Q ``(..., N, d_k)``, K ``(..., M, d_k)``, V ``(..., M, d_v)``: the forward's inputs.
        Y ``(..., N, d_v)``, rho ``(..., N)``: the forward's output and log-sum-exp.
        dY ``(..., N, d_v)``: the gradient of the loss with respect to ``Y``.
        io: an :class:`IOCounter` tallying the blocks read and written (``dQ`` lives in main memory
            and is read and written once per key tile; ``dK_t, dV_t`` stay in fast memory until their
            key tile is done).

    Returns:
        ``(dQ, dK, dV)``, shaped like ``Q, K, V``.

    Implements: eq-ext-flash-bwd
    """
    _check_qkv(Q, K, V, None)
    _check_blocks(block_q, block_k)
    N, M = Q.shape[-2], K.shape[-2]
    _check_causal(N, M, causal)
    want = {"Y": (*Q.shape[:-1], V.shape[-1]), "rho": tuple(Q.shape[:-1])}
    want["dY"] = want["Y"]
    for name, t in (("Y", Y), ("rho", rho), ("dY", dY)):
        if tuple(t.shape) != want[name]:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but Q {tuple(Q.shape)} and V {tuple(V.shape)} "
                f"need {want[name]}; pass the Y and rho that the forward returned for these inputs"
            )
    scale = _default_scale(Q, scale)
    io = io or IOCounter()
    delta = Q.new_empty(Q.shape[:-1])  # (..., N): delta_n = dY_n . Y_n
    for i0 in range(0, N, block_q):
        i1 = min(i0 + block_q, N)
        delta_i = (io.load(dY[..., i0:i1, :]) * io.load(Y[..., i0:i1, :])).sum(-1)
        delta[..., i0:i1] = io.store(delta_i)
    dQ = torch.zeros_like(Q)  # in main memory: read, updated and written back by every key tile
    dK, dV = torch.empty_like(K), torch.empty_like(V)
    for j0 in range(0, M, block_k):
        j1 = min(j0 + block_k, M)
        K_j, V_j = io.load(K[..., j0:j1, :]), io.load(V[..., j0:j1, :])
        dK_j, dV_j = torch.zeros_like(K_j), torch.zeros_like(V_j)  # stay in fast memory
        for i0 in range(0, N, block_q):
            i1 = min(i0 + block_q, N)
            if causal and i1 - 1 + M - N < j0:  # every query of this tile precedes every key
                continue
            Q_i, dY_i = io.load(Q[..., i0:i1, :]), io.load(dY[..., i0:i1, :])
            rho_i, delta_i = io.load(rho[..., i0:i1]), io.load(delta[..., i0:i1])
            S = scale * (Q_i @ K_j.mT)  # (..., bq, bk)
            if causal:
                q_pos = torch.arange(i0, i1, device=Q.device)[:, None] + (M - N)
                S = S.masked_fill(torch.arange(j0, j1, device=Q.device) > q_pos, float("-inf"))
            A = torch.exp(S - rho_i[..., None])  # the tile's weights, recomputed (eq-ext-lse)
            dV_j = dV_j + A.mT @ dY_i
            dA = dY_i @ V_j.mT  # (..., bq, bk)
            dS = A * (dA - delta_i[..., None])
            dQ[..., i0:i1, :] = io.store(io.load(dQ[..., i0:i1, :]) + scale * (dS @ K_j))
            dK_j = dK_j + scale * (dS.mT @ Q_i)
        dK[..., j0:j1, :], dV[..., j0:j1, :] = io.store(dK_j), io.store(dV_j)
    return dQ, dK, dV


class TiledAttentionFunction(torch.autograd.Function):
    """Tiled attention as an autograd function: the forward saves ``Q, K, V``, the output ``Y`` and
    the log-sum-exp ``rho`` (never the ``N x M`` weights); the backward is
    :func:`tiled_attention_backward`. Use it through :func:`tiled_attention_with_grad`."""

    @staticmethod
    def forward(ctx, Q, K, V, block_q, block_k, causal, scale):
        Y, rho = tiled_attention_forward(Q, K, V, block_q, block_k, causal, scale)
        ctx.save_for_backward(Q, K, V, Y, rho)
        ctx.options = (block_q, block_k, causal, scale)
        return Y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dY):
        Q, K, V, Y, rho = ctx.saved_tensors
        dQ, dK, dV = tiled_attention_backward(Q, K, V, Y, rho, dY.contiguous(), *ctx.options)
        return dQ, dK, dV, None, None, None, None


def tiled_attention_with_grad(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r""":func:`tiled_attention` whose gradients come from the tiled backward pass (book eqs.
    ``eq-ext-lse`` and ``eq-ext-flash-bwd``): what autograd keeps is ``Y`` and ``rho``, ``O(N)`` beyond
    the inputs and output, instead of the ``N x M`` weights. Same arguments and result as
    :func:`tiled_attention`.
    """
    return TiledAttentionFunction.apply(Q, K, V, block_q, block_k, causal, scale)


def _tiles(n: int, b: int) -> int:
    return -(-n // b)  # ceil(n / b)


def materialised_attention_io(N: int, M: int, d: int) -> tuple[int, int]:
    r"""Elements read and written by materialised attention, book eq. ``eq-ext-io``: three passes,
    :math:`S = c\,QK^\top` (read ``Q, K``, write ``S``), :math:`A = \operatorname{softmax}(S)` (read
    ``S``, write ``A``), :math:`Y = AV` (read ``A, V``, write ``Y``), each reading its inputs and
    writing its output once:

    ``reads = N d + 2 M d + 2 N M``, ``writes = 2 N M + N d`` (``d = d_k = d_v``), which is
    of the order of :math:`Nd + NM`. Returns ``(reads, writes)``.

    Implements: eq-ext-io
    """
    _check_sizes(N=N, M=M, d=d)
    return N * d + 2 * M * d + 2 * N * M, 2 * N * M + N * d


def tiled_attention_io(
    N: int, M: int, d: int, block_q: int, block_k: int, backward: bool = False
) -> tuple[int, int]:
    r"""Elements read and written by :func:`tiled_attention` (non-causal; ``d = d_k = d_v``), book eq.
    ``eq-ext-io``. With :math:`\tau_\text{q} = \lceil N / N_\text{t} \rceil` query tiles and
    :math:`\tau_\text{k} = \lceil M / M_\text{t} \rceil` key tiles, the forward reads ``Q`` once and ``K, V``
    once per query tile, and writes ``Y`` and ``rho``:

    ``reads = N d + 2 tau_q M d``, ``writes = N d + N``.

    With ``backward=True``, the counts of :func:`tiled_attention_backward` instead: ``delta`` from ``Y,
    dY`` (reads ``2 N d``, writes ``N``), ``K, V`` once, and per key tile ``Q, dY, dQ, rho, delta``:

    ``reads = 2 N d + 2 M d + tau_k (3 N d + 2 N)``, ``writes = N + tau_k N d + 2 M d``.

    Returns ``(reads, writes)``.

    Implements: eq-ext-io
    """
    _check_sizes(N=N, M=M, d=d)
    _check_blocks(block_q, block_k)
    if backward:
        tau_k = _tiles(M, block_k)
        return 2 * N * d + 2 * M * d + tau_k * (3 * N * d + 2 * N), N + tau_k * N * d + 2 * M * d
    tau_q = _tiles(N, block_q)
    return N * d + 2 * tau_q * M * d, N * d + N


def _check_sizes(**sizes: int) -> None:
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def materialised_attention(Q: Tensor, K: Tensor, V: Tensor, io: IOCounter | None = None) -> Tensor:
    """Softmax attention in three passes through main memory, each materialising its result
    (``S``, then ``A``, then ``Y``), with every pass's reads and writes tallied in ``io``: the
    instrumented counterpart of :func:`materialised_attention_io`. ``Q (..., N, d_k)``."""
    _check_qkv(Q, K, V, None)
    io = io or IOCounter()
    S = io.store(io.load(Q) @ io.load(K).mT * _default_scale(Q, None))  # (..., N, M)
    A = io.store(torch.softmax(io.load(S), dim=-1))
    return io.store(io.load(A) @ io.load(V))


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
