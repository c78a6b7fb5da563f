"""Exercises of the *Relations to CNNs, RNNs and GNNs* lab: the attention matrices of a convolution,
linear attention's running sums, the same sums with a gated (decaying) state, and attention restricted to
the edges of a graph.

Chapter: *Relations to CNNs, RNNs and GNNs* (Turner 2023, footnotes 4, 10 and 15; Katharopoulos et al.
2020; Sun et al. 2023; Yang et al. 2024; Dao and Gu 2024; Velickovic et al. 2018). Every input is
float64, so the checkers can use tight tolerances. The first trial of the convolution exercise has an
even number of taps, where a flipped kernel, a transposed matrix and the two possible centres all give
different matrices; the graphs are directed (an edge list, rows ``(m, n)`` for ``m -> n``) with a
self-loop on every node, so that no node is left without a neighbour whichever way the mask is read.
The gated exercise draws a different gate for every token: with one constant gate, decaying after the
update would cancel in the normalised output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. The attention matrices of a 1-D convolution with several channels


def _conv_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    C_out, C_in, J, N = ((2, 3, 4, 6), (3, 2, 3, 7), (2, 2, 5, 8))[trial % 3]
    return randn(gen, C_out, C_in, J), N


def _toeplitz(weight: Tensor, N: int, centre: int, wrap: bool = False) -> Tensor:
    """A[o, i, n, m] = weight[o, i, m - n + centre] where that is a tap (or, wrapped, modulo N)."""
    C_out, C_in, J = weight.shape
    A = weight.new_zeros(C_out, C_in, N, N)
    for n in range(N):
        for j in range(J):
            m = n + j - centre
            if wrap:
                m %= N
            elif not 0 <= m < N:
                continue
            A[:, :, n, m] += weight[:, :, j]
    return A


@exercise(
    name="relations.conv1d_attention_matrix",
    prompt=(
        "weight is (C_out, C_in, J), PyTorch's conv1d layout, and N an int. Return A of shape "
        "(C_out, C_in, N, N) with A[o, i, n, m] = weight[o, i, m - n + j0], j0 = (J - 1) // 2, and 0 "
        "where m - n + j0 is not a tap 0..J-1, so that Y[:, o] = sum_i A[o, i] @ X[:, i] equals "
        "F.conv1d(X.T[None], weight, padding='same')[0].T for tokens X of shape (N, C_in)."
    ),
    make_inputs=_conv_inputs,
    mistakes=[
        Mistake(
            "you flipped the kernel: that is a convolution in the signal-processing sense "
            "(np.convolve). Deep-learning 'convolutions' (F.conv1d, and Turner's A_{n',n} = A_{n'-n}) "
            "are cross-correlations: output n reads input n + j - j0 with tap j unflipped, so "
            "A[o, i, n, m] = weight[o, i, m - n + j0].",
            lambda w, N: _toeplitz(w.flip(-1), N, (w.shape[-1] - 1) // 2),
        ),
        Mistake(
            "each N x N matrix is transposed: row n must hold the weights with which OUTPUT n reads "
            "the inputs m, A[n, m] = k[m - n + j0]. A[m, n] is Turner's column form; read as rows "
            "it mirrors the kernel, k[n - m + j0]: for an odd J the flipped kernel (a true "
            "convolution), for an even J the flipped kernel one place off.",
            lambda w, N: _toeplitz(w, N, (w.shape[-1] - 1) // 2).transpose(-2, -1),
        ),
        Mistake(
            "the kernel is not centred: A[n, m] = k[m - n] puts tap 0 on the diagonal, so the output "
            "is shifted by j0 places. 'same' padding puts tap j0 = (J - 1) // 2 on the diagonal: "
            "A[n, m] = k[m - n + j0].",
            lambda w, N: _toeplitz(w, N, 0),
        ),
        Mistake(
            "off by one for an even number of taps: you centred the kernel on tap J // 2. PyTorch's "
            "'same' padding puts the extra zero on the right, so the centre is j0 = (J - 1) // 2.",
            lambda w, N: _toeplitz(w, N, w.shape[-1] // 2),
        ),
        Mistake(
            "your taps wrap around the ends (circular padding): with zero padding a tap that falls "
            "off the sequence reads a zero, so those entries of A must stay 0.",
            lambda w, N: _toeplitz(w, N, (w.shape[-1] - 1) // 2, wrap=True),
        ),
        Mistake(
            "the channel axes are swapped: the result is (C_out, C_in, N, N) and A[o, i] uses "
            "weight[o, i], the kernel from input channel i to output channel o.",
            lambda w, N: _toeplitz(w, N, (w.shape[-1] - 1) // 2).transpose(0, 1),
        ),
    ],
)
def conv1d_attention_matrix(weight: Tensor, N: int) -> Tensor:
    C_out, C_in, J = weight.shape
    j0 = (J - 1) // 2  # the centre tap, on the diagonal ('same' padding)
    A = torch.zeros(C_out, C_in, N, N, dtype=weight.dtype)
    for n in range(N):  # output position
        for j in range(J):  # tap j reads input m = n + j - j0
            m = n + j - j0
            if 0 <= m < N:  # zero padding: taps off the sequence read nothing
                A[:, :, n, m] = weight[:, :, j]
    return A


# ---------------------------------------------------------------------------------------------------
# 2. Causal linear attention as a recurrent network


def _linear_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor]:
    N, d_k, d_v = ((5, 3, 2), (7, 4, 3), (6, 2, 4))[trial % 3]
    return randn(gen, N, d_k), randn(gen, N, d_k), randn(gen, N, d_v)


def _psi(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def _causal_linear(Q, K, V, psi=_psi, normalise="query", causal=True):
    A = psi(Q) @ psi(K).T  # (N, N)
    if causal:
        A = A.tril()
    num = A @ V
    if normalise is None:
        return num
    if normalise == "query":
        return num / A.sum(-1, keepdim=True)
    zeta = psi(K).cumsum(0)  # (N, r): the running sum of the keys' features
    return num / zeta.sum(-1, keepdim=True)  # the entries of zeta_t summed, without psi(q_t)


@exercise(
    name="relations.linear_attention_recurrent",
    prompt=(
        "Q, K are (N, d_k) and V is (N, d_v). With psi(x) = F.elu(x) + 1, compute causal linear "
        "attention one token at a time: start from Gamma = 0 (d_k, d_v) and zeta = 0 (d_k,); for "
        "t = 0..N-1 add psi(k_t) v_t^T to Gamma and psi(k_t) to zeta, then output "
        "y_t = (psi(q_t) @ Gamma) / (psi(q_t) @ zeta). Return Y of shape (N, d_v)."
    ),
    make_inputs=_linear_inputs,
    mistakes=[
        Mistake(
            "the normaliser is missing: psi(q_t) @ Gamma_t is only the numerator. Divide it by "
            "psi(q_t) @ zeta_t, the sum of this query's weights over the tokens so far, so that the "
            "weights sum to one.",
            lambda Q, K, V: _causal_linear(Q, K, V, normalise=None),
        ),
        Mistake(
            "the normaliser must be psi(q_t) @ zeta_t, the sum of THIS query's weights; you divided by "
            "the sum of zeta_t's entries, which ignores the query.",
            lambda Q, K, V: _causal_linear(Q, K, V, normalise="zeta"),
        ),
        Mistake(
            "your output at t uses the keys and values of later tokens: the running sums must only "
            "include tokens 0..t (update Gamma and zeta, then read them, inside the loop).",
            lambda Q, K, V: _causal_linear(Q, K, V, causal=False),
        ),
        Mistake(
            "psi is missing: linear attention compares psi(q) and psi(k), with psi(x) = elu(x) + 1 > 0, "
            "so that every weight is positive; raw q . k can be negative.",
            lambda Q, K, V: _causal_linear(Q, K, V, psi=lambda x: x),
        ),
        Mistake(
            "this is causal softmax attention (exp(q . k / sqrt(d_k))). Linear attention replaces the "
            "exponential by psi(q) . psi(k), which is what lets it keep running sums.",
            lambda Q, K, V: (
                torch.softmax(
                    (Q @ K.T / math.sqrt(Q.shape[-1])).masked_fill(
                        ~torch.ones(Q.shape[0], Q.shape[0], dtype=torch.bool).tril(), float("-inf")
                    ),
                    dim=-1,
                )
                @ V
            ),
        ),
    ],
)
def linear_attention_recurrent(Q: Tensor, K: Tensor, V: Tensor) -> Tensor:
    psi = lambda x: F.elu(x) + 1  # noqa: E731  (positive features)
    Gamma = torch.zeros(K.shape[1], V.shape[1], dtype=Q.dtype)  # (d_k, d_v): sum of psi(k) v^T
    zeta = torch.zeros(K.shape[1], dtype=Q.dtype)  # (d_k,): sum of psi(k)
    ys = []
    for t in range(Q.shape[0]):
        Gamma = Gamma + torch.outer(psi(K[t]), V[t])  # add token t first: causal, t included
        zeta = zeta + psi(K[t])
        q = psi(Q[t])
        ys.append((q @ Gamma) / (q @ zeta))  # (d_v,)
    return torch.stack(ys)  # (N, d_v)


# ---------------------------------------------------------------------------------------------------
# 3. Attention restricted to a graph


def _graph_inputs(gen: torch.Generator, trial: int) -> tuple:
    N, D, d_k, d_v, E = ((6, 4, 3, 2, 10), (5, 3, 2, 3, 8), (7, 5, 4, 3, 14))[trial % 3]
    src = torch.randint(0, N, (E,), generator=gen)
    step = torch.randint(1, N, (E,), generator=gen)  # never 0: these edges are not self-loops
    loops = torch.arange(N)
    edges = torch.cat([torch.stack([src, (src + step) % N], 1), torch.stack([loops, loops], 1)])
    X = randn(gen, N, D)
    return X, edges, randn(gen, D, d_k), randn(gen, D, d_k), randn(gen, D, d_v)


def _masked(X, edges, W_q, W_k, W_v, orient="in", renormalise=True, scale=True):
    N = X.shape[0]
    mask = torch.zeros(N, N, dtype=torch.bool)
    if orient in ("in", "both", "none"):
        mask[edges[:, 1], edges[:, 0]] = True
    if orient in ("out", "both"):
        mask[edges[:, 0], edges[:, 1]] = True
    if orient == "none":
        mask[:] = True
    S = (X @ W_q) @ (X @ W_k).T / (math.sqrt(W_q.shape[1]) if scale else 1.0)
    if renormalise:
        A = torch.softmax(S.masked_fill(~mask, float("-inf")), dim=-1)
    else:
        A = torch.softmax(S, dim=-1) * mask  # zeroed after the softmax: rows no longer sum to one
    return A @ (X @ W_v)


@exercise(
    name="relations.graph_attention",
    prompt=(
        "X is (N, D) (one feature row per node), edges is an (E, 2) long tensor whose row (m, n) is "
        "an edge m -> n (m sends to n; every node has a self-loop), W_q, W_k are (D, d_k) and W_v is "
        "(D, d_v). Return Y (N, d_v): node n attends, with scaled dot-product scores "
        "(x_n W_q).(x_m W_k) / sqrt(d_k) and a softmax, only to the nodes m with an edge m -> n."
    ),
    make_inputs=_graph_inputs,
    mistakes=[
        Mistake(
            "your mask is transposed: node n must attend to the nodes that send to it (edges m -> n), "
            "so mask[n, m] = True for each edge row (m, n), i.e. mask[edges[:, 1], edges[:, 0]]. "
            "Using the adjacency matrix Adj[m, n] as the mask reverses every edge.",
            lambda X, e, W_q, W_k, W_v: _masked(X, e, W_q, W_k, W_v, orient="out"),
        ),
        Mistake(
            "you treated the graph as undirected (an edge m -> n also lets m attend to n); the edges "
            "are directed: only mask[n, m] = True for an edge (m, n).",
            lambda X, e, W_q, W_k, W_v: _masked(X, e, W_q, W_k, W_v, orient="both"),
        ),
        Mistake(
            "every node attends to every node: that is self-attention on the complete graph. Mask the "
            "scores of non-neighbours with -inf before the softmax.",
            lambda X, e, W_q, W_k, W_v: _masked(X, e, W_q, W_k, W_v, orient="none"),
        ),
        Mistake(
            "you zeroed the non-neighbours AFTER the softmax, so each row's weights no longer sum to "
            "one; mask the scores with -inf BEFORE the softmax, which renormalises over the "
            "neighbours.",
            lambda X, e, W_q, W_k, W_v: _masked(X, e, W_q, W_k, W_v, renormalise=False),
        ),
        Mistake(
            "the scores are not scaled: divide (x_n W_q).(x_m W_k) by sqrt(d_k).",
            lambda X, e, W_q, W_k, W_v: _masked(X, e, W_q, W_k, W_v, scale=False),
        ),
    ],
)
def graph_attention(X: Tensor, edges: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    N = X.shape[0]
    mask = torch.zeros(N, N, dtype=torch.bool)
    mask[edges[:, 1], edges[:, 0]] = True  # query n (row) may attend to key m (column) if m -> n
    S = (X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[1])  # (N, N) scores
    A = torch.softmax(S.masked_fill(~mask, float("-inf")), dim=-1)  # softmax over in-neighbours
    return A @ (X @ W_v)  # (N, d_v)


# ---------------------------------------------------------------------------------------------------
# 4. Linear attention with a gated (decaying) state


def _gated_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    N, d_k, d_v = ((6, 3, 2), (8, 4, 3), (7, 2, 4))[trial % 3]
    gamma = torch.sigmoid(2 * randn(gen, N))  # (N,): one gate per token, in (0, 1), all different
    return randn(gen, N, d_k), randn(gen, N, d_k), randn(gen, N, d_v), gamma


def _gated(Q, K, V, gamma, decay=None, order="before", decay_zeta=True, normalise=True):
    """The gated recurrence with a chosen mistake; decay(t) gives the factor applied at step t."""
    decay = decay or (lambda t: gamma[t])
    Gamma = torch.zeros(K.shape[1], V.shape[1], dtype=Q.dtype)
    zeta = torch.zeros(K.shape[1], dtype=Q.dtype)
    ys = []
    for t in range(Q.shape[0]):
        g, pk = decay(t), _psi(K[t])
        if order == "before":
            Gamma = g * Gamma + torch.outer(pk, V[t])
            zeta = (g if decay_zeta else 1.0) * zeta + pk
        else:  # decay after adding token t
            Gamma = g * (Gamma + torch.outer(pk, V[t]))
            zeta = (g if decay_zeta else 1.0) * (zeta + pk)
        q = _psi(Q[t])
        ys.append((q @ Gamma) / (q @ zeta) if normalise else q @ Gamma)
    return torch.stack(ys)


def _current_gate_power(Q, K, V, gamma):
    """gamma_n^(n - m): the current token's gate used for every step back."""
    N = Q.shape[0]
    n, m = torch.arange(N)[:, None], torch.arange(N)[None, :]
    D = (gamma[:, None] ** (n - m).clamp(min=0)) * (m <= n)
    A = (_psi(Q) @ _psi(K).T) * D
    return (A @ V) / A.sum(-1, keepdim=True)


@exercise(
    name="relations.gated_linear_attention",
    prompt=(
        "Q, K are (N, d_k), V is (N, d_v) and gamma is (N,), one gate in (0, 1) per token. With "
        "psi(x) = F.elu(x) + 1, run linear attention with a decaying state, one token at a time: start "
        "from Gamma = 0 (d_k, d_v) and zeta = 0 (d_k,); for t = 0..N-1 first multiply both by "
        "gamma[t], then add psi(k_t) v_t^T to Gamma and psi(k_t) to zeta, then output "
        "y_t = (psi(q_t) @ Gamma) / (psi(q_t) @ zeta). Return Y of shape (N, d_v)."
    ),
    make_inputs=_gated_inputs,
    mistakes=[
        Mistake(
            "you decayed the state AFTER adding the new token, so token t is already multiplied by "
            "its own gate gamma_t: the weight of token m at step n became gamma_m ... gamma_n instead "
            "of gamma_{m+1} ... gamma_n. Decay first (the old state forgets), then add psi(k_t) v_t^T.",
            lambda Q, K, V, g: _gated(Q, K, V, g, order="after"),
        ),
        Mistake(
            "the normaliser zeta is not decayed: it must forget at the same rate as Gamma "
            "(zeta_t = gamma_t zeta_{t-1} + psi(k_t)), otherwise the weights of a query no longer sum "
            "to one and old tokens still count in the denominator.",
            lambda Q, K, V, g: _gated(Q, K, V, g, decay_zeta=False),
        ),
        Mistake(
            "the normaliser is missing: psi(q_t) @ Gamma_t is only the numerator; divide it by "
            "psi(q_t) @ zeta_t, with zeta decayed like Gamma.",
            lambda Q, K, V, g: _gated(Q, K, V, g, normalise=False),
        ),
        Mistake(
            "the state never forgets: that is plain linear attention. Multiply Gamma and zeta by "
            "gamma[t] at every step, before adding token t.",
            lambda Q, K, V, g: _gated(Q, K, V, g, decay=lambda t: 1.0),
        ),
        Mistake(
            "you weighted token m at step n by gamma_n^(n - m), the current token's gate for every "
            "step back, as if the gate were RetNet's constant decay. With a gate per token the weight "
            "is the product gamma_{m+1} gamma_{m+2} ... gamma_n of the gates that came after token m.",
            _current_gate_power,
        ),
    ],
)
def gated_linear_attention(Q: Tensor, K: Tensor, V: Tensor, gamma: Tensor) -> Tensor:
    psi = lambda x: F.elu(x) + 1  # noqa: E731  (positive features)
    Gamma = torch.zeros(K.shape[1], V.shape[1], dtype=Q.dtype)  # (d_k, d_v)
    zeta = torch.zeros(K.shape[1], dtype=Q.dtype)  # (d_k,)
    ys = []
    for t in range(Q.shape[0]):
        Gamma = gamma[t] * Gamma + torch.outer(psi(K[t]), V[t])  # forget first, then add token t
        zeta = gamma[t] * zeta + psi(K[t])  # the normaliser forgets at the same rate
        q = psi(Q[t])
        ys.append((q @ Gamma) / (q @ zeta))  # (d_v,)
    return torch.stack(ys)  # (N, d_v)
