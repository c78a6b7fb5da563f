"""Relations to CNNs, RNNs and GNNs: convolution as attention with fixed shift matrices, what recursion
does with distance, linear attention as a recurrent network, and attention as message passing on a graph.

Chapter: *Relations to CNNs, RNNs and GNNs* (Turner 2023, footnotes 4, 10 and 15; Cordonnier et al.
2020; Katharopoulos et al. 2020; Velickovic et al. 2018; Child et al. 2019). It builds on
:func:`.attention.convolution_as_attention` (one kernel, one channel: a Toeplitz matrix) and on the
message-passing section of chapter *The transformer block*.

Conventions: rows are tokens. A sequence ``X`` is ``(..., N, C_in)`` (a convolution's input channels are
the token's features); PyTorch's convolution weights keep their own layout, ``(C_out, C_in, J)`` in 1-D
and ``(C_out, C_in, J_h, J_w)`` in 2-D. Tap ``j`` of a 1-D kernel, ``F_j = weight[:, :, j].T``, is a
``(C_in, C_out)`` matrix and reads the token ``delta = j - j_0`` places away, ``j_0 = (J - 1) // 2`` (the
offsets of ``padding="same"``; no kernel flip: a cross-correlation, as in every deep-learning library).
The shift matrix ``Lambda_delta`` ``(N, N)`` has ``Lambda[n, m] = 1`` where ``m = n + delta`` (zero padding:
rows whose neighbour falls off the sequence are zero).

Graphs are lists of directed edges ``(E, 2)``, one row ``(m, n)`` per edge, read "node ``m`` sends a
message to node ``n``". Node ``n`` attends to its in-neighbours, so the attention mask (``True`` = query
``n`` may attend to key ``m``, the package's convention) is the *transpose* of the adjacency matrix
``Adj[m, n] = 1``: :func:`adjacency_mask` builds it from the edges. A node without incoming edges gets a
zero output, the package's rule for a query that may attend to nothing.
"""

from __future__ import annotations

from .convolution import (
    conv1d_as_attention,
    conv1d_attention_matrix,
    conv1d_flat_matrix,
    conv1d_reference,
    conv2d_as_attention,
    conv2d_reference,
    relative_shift_attention,
    shift_matrices,
    shift_matrices_2d,
)
from .graphs import (
    adjacency_mask,
    edges_of,
    gat_attention,
    gat_attention_loop,
    gat_scores,
    graph_attention,
    graph_attention_edges,
    graph_attention_loop,
    strided_edges,
    window_edge_count,
    window_edges,
)
from .linear_attention import (
    PositiveRandomFeatures,
    decay_matrix,
    elu_feature_map,
    gated_linear_attention_parallel,
    gated_linear_attention_recurrent,
    gated_linear_attention_step,
    linear_attention_parallel,
    linear_attention_recurrent,
    linear_attention_step,
    positive_random_feature_map,
    positive_random_features,
)
from .recurrent import (
    TanhRNN,
    autograd_depth,
    influence,
    influence_vs_distance,
    influence_vs_length,
    output_jacobian,
    rnn_state_jacobian,
    tanh_rnn_reference,
)

__all__ = [
    "PositiveRandomFeatures",
    "TanhRNN",
    "adjacency_mask",
    "autograd_depth",
    "conv1d_as_attention",
    "conv1d_attention_matrix",
    "conv1d_flat_matrix",
    "conv1d_reference",
    "conv2d_as_attention",
    "conv2d_reference",
    "decay_matrix",
    "edges_of",
    "elu_feature_map",
    "gat_attention",
    "gat_attention_loop",
    "gat_scores",
    "gated_linear_attention_parallel",
    "gated_linear_attention_recurrent",
    "gated_linear_attention_step",
    "graph_attention",
    "graph_attention_edges",
    "graph_attention_loop",
    "influence",
    "influence_vs_distance",
    "influence_vs_length",
    "linear_attention_parallel",
    "linear_attention_recurrent",
    "linear_attention_step",
    "output_jacobian",
    "positive_random_feature_map",
    "positive_random_features",
    "relative_shift_attention",
    "rnn_state_jacobian",
    "shift_matrices",
    "shift_matrices_2d",
    "strided_edges",
    "tanh_rnn_reference",
    "window_edge_count",
    "window_edges",
]
