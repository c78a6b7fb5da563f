"""Relations: graphs: attention restricted to the edges."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import shape_of as _shape
from ..self_attention import single_head
from ._checks import _check_size, _check_tokens


def _check_edges(edges: Tensor, N: int) -> Tensor:
    _check_size("N (nodes)", N)
    if not isinstance(edges, Tensor) or edges.dim() != 2 or edges.shape[1] != 2:
        got = _shape(edges) if isinstance(edges, Tensor) else type(edges).__name__
        raise ValueError(f"edges must be an (E, 2) tensor of (source m, target n) rows, got {got}")
    if edges.is_floating_point() or edges.dtype == torch.bool:
        raise TypeError(f"edges must hold integer node indices, got dtype {edges.dtype}")
    if edges.numel() and (edges.min() < 0 or edges.max() >= N):
        raise ValueError(
            f"edges name nodes {int(edges.min())}..{int(edges.max())} but the graph has N={N} "
            f"nodes 0..{N - 1}"
        )
    return edges.long()


def adjacency_mask(edges: Tensor, N: int) -> Tensor:
    r"""The attention mask of a graph, book eq. ``eq-rel-graph``: ``mask[n, m]`` is ``True`` when
    there is an edge ``m -> n``.

    .. math:: \mathsf{mask}_{nm} = [\, (m, n) \in \mathcal{E}\,] = \mathrm{Adj}_{mn}

    Query ``n`` attends to the nodes that send it messages, so the mask is the *transpose* of the
    adjacency matrix (``Adj[m, n] = 1`` for an edge ``m -> n``); for an undirected graph (every edge
    listed both ways) the two agree.

    Args:
        edges: ``(E, 2)`` integer tensor, one row ``(m, n)`` per directed edge ``m -> n``.
        N: nodes.

    Returns:
        bool ``(N, N)`` on the edges' device.

    Raises:
        ValueError / TypeError: for a malformed edge list or a node index outside ``0..N-1``.

    Implements: eq-rel-graph
    """
    edges = _check_edges(edges, N)
    mask = torch.zeros(N, N, dtype=torch.bool, device=edges.device)
    mask[edges[:, 1], edges[:, 0]] = True  # row = target (query), column = source (key)
    return mask


def edges_of(mask: Tensor) -> Tensor:
    """The edge list ``(E, 2)`` of rows ``(m, n)`` of an attention mask (the inverse of
    :func:`adjacency_mask`): every ``mask[n, m] == True`` is an edge ``m -> n``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        got = _shape(mask) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool (N, N) tensor, got {got}")
    return mask.nonzero().flip(1)  # nonzero gives (n, m) rows


def window_edges(N: int, reach: int, causal: bool = False) -> Tensor:
    r"""The graph of local (sliding-window) attention: an edge ``m -> n`` whenever
    :math:`|n - m| \le` ``reach`` (and :math:`m \le n` if ``causal``), self-loops included. The
    ``reach`` counts the tokens on each side; the book's window width is :math:`w` = ``reach + 1``
    (book eq. ``eq-rel-window`` and chapter *Extensions*, whose width counts the token itself; the
    Longformer's window size counts both sides, ``2 * reach``).

    Built offset by offset, never as an ``N x N`` matrix, so long sequences are cheap. The number of
    edges is :func:`window_edge_count`.

    Implements: eq-rel-window

    Returns:
        ``(E, 2)`` long tensor of ``(m, n)`` rows.
    """
    _check_size("N", N)
    _check_size("reach (tokens on each side)", reach, least=0)
    n = torch.arange(N)
    parts = []
    for d in range(-reach if not causal else 0, reach + 1):  # m = n - d
        keep = (n - d >= 0) & (n - d < N)
        parts.append(torch.stack([n[keep] - d, n[keep]], dim=1))
    return torch.cat(parts)


def window_edge_count(N: int, reach: int, causal: bool = False) -> int:
    r"""Edges of :func:`window_edges` (book eq. ``eq-rel-window`` with the width
    :math:`w` = ``reach + 1``), with :math:`r = \min(\text{reach}, N-1)`:

    .. math:: |\mathcal{E}| = N(2r+1) - r(r+1) \quad\text{or, causal,}\quad
              N(r+1) - \tfrac{1}{2} r(r+1)

    Implements: eq-rel-window
    """
    _check_size("N", N)
    _check_size("reach (tokens on each side)", reach, least=0)
    r = min(reach, N - 1)
    return N * (r + 1) - r * (r + 1) // 2 if causal else N * (2 * r + 1) - r * (r + 1)


def strided_edges(N: int, stride: int) -> Tensor:
    r"""The causal graph of the strided sparse attention of Child et al. (2019), both of its heads
    together: node ``n`` reads the ``stride`` nodes before it and every ``stride``-th node before
    those, an edge ``m -> n`` whenever :math:`0 \le n - m \le \text{stride}` or ``stride`` divides
    :math:`n - m`. With ``stride`` about :math:`\sqrt N` the last nodes have about
    :math:`2\sqrt N` in-neighbours and a node has about :math:`1.5\sqrt N` on average (``stride + 1``
    near ones, and :math:`n/\text{stride}` strided ones, :math:`\sqrt N / 2` on average), so
    :math:`O(N\sqrt N)` edges in all.

    Returns:
        ``(E, 2)`` long tensor of ``(m, n)`` rows, each edge once.
    """
    _check_size("N", N)
    _check_size("stride", stride)
    offsets = sorted(set(range(min(stride, N - 1) + 1)) | set(range(0, N, stride)))
    n = torch.arange(N)
    return torch.cat([torch.stack([n[d:] - d, n[d:]], dim=1) for d in offsets])


def _check_graph_weights(X: Tensor, **W: Tensor) -> None:
    _check_tokens(X)
    D = X.shape[-1]
    for name, w in W.items():
        if not isinstance(w, Tensor) or w.dim() != 2 or w.shape[0] != D:
            got = _shape(w) if isinstance(w, Tensor) else type(w).__name__
            raise ValueError(f"{name} must be (D, d) = ({D}, d) for X {_shape(X)}, got {got}")


def graph_attention_loop(X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    r"""Dot-product attention as message passing, node by node and edge by edge, book eq.
    ``eq-rel-graph``.

    .. math:: S_{nm} = \frac{(W_q^\top\mathbf{x}_n)^\top(W_k^\top\mathbf{x}_m)}{\sqrt{d_k}},\quad
              A_{nm} = \frac{\exp S_{nm}}{\sum_{m' \in \mathcal{N}(n)} \exp S_{nm'}},\quad
              \mathbf{y}_n = \sum_{m\in\mathcal{N}(n)} A_{nm} W_v^\top\mathbf{x}_m

    with :math:`\mathcal{N}(n) = \{m : (m, n) \in \mathcal{E}\}` the in-neighbours of ``n``
    (chapter *The transformer block*, eq. ``eq-block-gnn``). A node with no in-neighbour gets zeros.

    Args:
        X: node features ``(N, D)``; edges: ``(E, 2)`` rows ``(m, n)``.
        W_q, W_k: ``(D, d_k)``; W_v: ``(D, d_v)``.

    Returns:
        ``(N, d_v)``.

    Raises:
        ValueError / TypeError: for malformed edges or weights that do not fit ``X``.
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = _check_edges(edges, N)
    Y = X.new_zeros(N, W_v.shape[1])
    for n in range(N):
        sources = sorted({int(m) for m, t in edges.tolist() if t == n})  # in-neighbours of n
        if not sources:
            continue
        q = X[n] @ W_q  # (d_k,)
        e = torch.stack([q @ (X[m] @ W_k) for m in sources]) / math.sqrt(W_q.shape[1])
        a = torch.exp(e - e.max())
        a = a / a.sum()  # softmax over n's in-neighbours
        for a_nm, m in zip(a, sources, strict=True):
            Y[n] += a_nm * (X[m] @ W_v)  # the message from m
    return Y


def graph_attention(X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    r"""Dot-product graph attention as masked self-attention, book eq. ``eq-rel-graph``:
    :func:`.self_attention.single_head` with the mask :func:`adjacency_mask`. Cost :math:`O(N^2)`
    whatever the number of edges. Same arguments, result and errors as :func:`graph_attention_loop`
    (tested equal); ``X`` may carry leading batch dimensions (one graph for all).

    Implements: eq-rel-graph
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    return single_head(X, W_q, W_k, W_v, adjacency_mask(edges, X.shape[-2]))


def graph_attention_edges(
    X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor
) -> Tensor:
    r"""Dot-product graph attention computed on the edge list, book eq. ``eq-rel-graph``: one score per
    edge and a softmax grouped by target node, cost :math:`O(|\mathcal{E}|\,(d_k + d_v))` instead of
    :math:`O(N^2)`. Same arguments, result and errors as :func:`graph_attention_loop` (tested equal);
    duplicate edges count once.

    Implements: eq-rel-graph
    """
    _check_graph_weights(X, W_q=W_q, W_k=W_k, W_v=W_v)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = torch.unique(_check_edges(edges, N).to(X.device), dim=0)  # (E, 2)
    src, dst = edges[:, 0], edges[:, 1]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # per node
    e = (Q[dst] * K[src]).sum(-1) / math.sqrt(W_q.shape[1])  # (E,): one score per edge
    top = torch.full((N,), float("-inf"), dtype=X.dtype, device=X.device)
    top = top.scatter_reduce(0, dst, e, reduce="amax")  # each target's largest score
    p = torch.exp(e - top[dst])  # (E,)
    z = X.new_zeros(N).index_add(0, dst, p)  # (N,): the softmax denominators
    a = p / z[dst]  # (E,): A_nm, summing to one over each target's edges
    return X.new_zeros(N, W_v.shape[1]).index_add(0, dst, a[:, None] * V[src])


def gat_scores(
    X: Tensor, W: Tensor, u_dst: Tensor, u_src: Tensor, negative_slope: float = 0.2
) -> Tensor:
    r"""The score of a graph-attention (GAT) layer for every pair, book eq. ``eq-rel-gat``.

    .. math:: S_{nm} = \operatorname{LeakyReLU}\big(\mathbf{u}^\top [W^\top\mathbf{x}_n \,\Vert\,
              W^\top\mathbf{x}_m]\big) = \operatorname{LeakyReLU}\big(\mathbf{u}_1^\top W^\top
              \mathbf{x}_n + \mathbf{u}_2^\top W^\top \mathbf{x}_m\big)

    (Velickovic et al. 2018, with :math:`\mathbf{u} = [\mathbf{u}_1; \mathbf{u}_2]` their vector
    :math:`\vec a`): one map ``W`` for scores and messages, an additive score, no :math:`\sqrt{d_k}`.

    Args:
        X: ``(..., N, D)``; W: ``(D, d_v)``; u_dst, u_src: ``(d_v,)`` (:math:`\mathbf{u}_1`, for the
            receiving node, and :math:`\mathbf{u}_2`, for the sender); negative_slope: of LeakyReLU.

    Returns:
        ``(..., N, N)``, row ``n`` the scores of the senders ``m`` for receiver ``n``.

    Implements: eq-rel-gat
    """
    _check_graph_weights(X, W=W)
    for name, u in (("u_dst", u_dst), ("u_src", u_src)):
        if not isinstance(u, Tensor) or u.shape != (W.shape[1],):
            got = _shape(u) if isinstance(u, Tensor) else type(u).__name__
            raise ValueError(
                f"{name} must be (d_v,) = ({W.shape[1]},) for W {_shape(W)}, got {got}"
            )
    Z = X @ W  # (..., N, d_v)
    return F.leaky_relu((Z @ u_dst)[..., :, None] + (Z @ u_src)[..., None, :], negative_slope)


def gat_attention(
    X: Tensor,
    edges: Tensor,
    W: Tensor,
    u_dst: Tensor,
    u_src: Tensor,
    negative_slope: float = 0.2,
) -> Tensor:
    r"""A single-head GAT layer before its output nonlinearity, book eq. ``eq-rel-gat``:
    :math:`\mathbf{y}_n = \sum_{m\in\mathcal{N}(n)} \operatorname{softmax}_m(S_{nm})\, W^\top\mathbf{x}_m`,
    the scores :func:`gat_scores` masked by :func:`adjacency_mask` (nodes with no in-neighbour get
    zeros). Arguments as :func:`gat_scores` plus ``edges (E, 2)``; returns ``(..., N, d_v)``; tested
    equal to :func:`gat_attention_loop`.

    Implements: eq-rel-gat
    """
    e = gat_scores(X, W, u_dst, u_src, negative_slope)  # (..., N, N)
    mask = adjacency_mask(edges, X.shape[-2]).to(X.device)
    has = mask.any(dim=-1, keepdim=True)  # (N, 1)
    A = torch.softmax(e.masked_fill(~mask, float("-inf")).masked_fill(~has, 0.0), dim=-1) * has
    return A @ (X @ W)


def gat_attention_loop(
    X: Tensor,
    edges: Tensor,
    W: Tensor,
    u_dst: Tensor,
    u_src: Tensor,
    negative_slope: float = 0.2,
) -> Tensor:
    r"""The GAT layer of :func:`gat_attention` node by node, with the score written as the paper's
    concatenation :math:`\mathbf{u}^\top[W^\top\mathbf{x}_n \Vert W^\top\mathbf{x}_m]`, book eq.
    ``eq-rel-gat``. ``X`` is one graph ``(N, D)``."""
    _check_graph_weights(X, W=W)
    if X.dim() != 2:
        raise ValueError(f"X must be the features of one graph (N, D), got {_shape(X)}")
    N = X.shape[0]
    edges = _check_edges(edges, N)
    u = torch.cat([u_dst, u_src])  # (2 d_v,): the paper's vector a
    Y = X.new_zeros(N, W.shape[1])
    for n in range(N):
        sources = sorted({int(m) for m, t in edges.tolist() if t == n})
        if not sources:
            continue
        e = torch.stack(
            [F.leaky_relu(u @ torch.cat([X[n] @ W, X[m] @ W]), negative_slope) for m in sources]
        )
        a = torch.softmax(e, dim=0)
        for a_nm, m in zip(a, sources, strict=True):
            Y[n] += a_nm * (X[m] @ W)
    return Y
