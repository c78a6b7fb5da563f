"""``scratch/attention.py`` equals the package and PyTorch: the package's weights loaded into the scratch
layers by name (``in_proj`` split into ``W_q, W_k, W_v``; ``out_proj`` -> ``W_o``), float64, max |Δ| at
most 1e-12, with and without masks; and the comparison catches a realistic wrong split of the heads."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course.scratch import attention as scratch

TOL = 1e-12
# (B, N, D, H): one head, one token, heads of width 1, and ordinary sizes
SHAPES = [(1, 1, 4, 1), (2, 1, 6, 3), (2, 5, 8, 1), (3, 7, 12, 4), (2, 6, 16, 16), (4, 9, 8, 2)]
MASKS = [None, "causal", "padding", "causal+padding", "random"]


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def make_mask(kind: str | None, B: int, N: int, seed: int = 0) -> torch.Tensor | None:
    """A bool "may attend" mask, (N, N) or (B, N, N), in which every query keeps at least one key."""
    g = torch.Generator().manual_seed(seed)
    if kind is None:
        return None
    if kind == "causal":
        return tc.self_attention.causal_mask(N)
    lengths = torch.randint(1, N + 1, (B,), generator=g)  # real tokens per sequence, >= 1
    padding = tc.self_attention.key_padding_mask(lengths, N)  # (B, N, N)
    if kind == "padding":
        return padding
    if kind == "causal+padding":
        return padding & tc.self_attention.causal_mask(N)  # key 0 stays visible to every query
    mask = torch.rand(B, N, N, generator=g) < 0.5
    return mask | torch.eye(N, dtype=torch.bool)  # every query may attend to itself


def scratch_state(layer: tc.multihead.AttentionLayer) -> dict[str, torch.Tensor]:
    """The package layer's weights under the scratch names: the fused ``in_proj`` (3D, D), which stacks
    ``[W_q^T; W_k^T; W_v^T]``, split in three; ``out_proj`` renamed ``W_o``."""
    state = {}
    for key, tensor in layer.state_dict().items():  # "in_proj.weight", "out_proj.bias", ...
        module, kind = key.split(".")
        if module == "in_proj":
            for name, block in zip(("W_q", "W_k", "W_v"), tensor.chunk(3), strict=True):
                state[f"{name}.{kind}"] = block
        else:
            state[f"W_o.{kind}"] = tensor
    return state


def package_and_scratch(D, H, causal=False, bias=True, seed=0):
    torch.manual_seed(seed)
    package = tc.multihead.SelfAttention(D, H, causal=causal, bias=bias).double().eval()
    ours = scratch.MultiHeadAttention(D, H, bias=bias).double()
    ours.load_state_dict(scratch_state(package), strict=True)
    return package, ours


# ----------------------------------------------------------------------------------------------
# MultiHeadAttention == the package's SelfAttention == torch.nn.MultiheadAttention


@pytest.mark.parametrize(("B", "N", "D", "H"), SHAPES)
@pytest.mark.parametrize("kind", MASKS)
def test_multi_head_equals_the_package(B, N, D, H, kind):
    package, ours = package_and_scratch(D, H)
    X = torch.randn(B, N, D, dtype=torch.float64)
    mask = make_mask(kind, B, N)
    with torch.no_grad():
        assert gap(ours(X, mask), package(X, mask)) <= TOL


@pytest.mark.parametrize(("B", "N", "D", "H"), SHAPES)
@pytest.mark.parametrize("kind", [None, "padding"])
def test_multi_head_with_a_causal_mask_equals_the_causal_package_layer(B, N, D, H, kind):
    """The package's causal layer masks the future itself and ands a given key mask with it."""
    package, ours = package_and_scratch(D, H, causal=True, seed=1)
    X = torch.randn(B, N, D, dtype=torch.float64)
    keys = make_mask(kind, B, N)
    causal = tc.self_attention.causal_mask(N)
    with torch.no_grad():
        expected = package(X, keys)
        assert gap(ours(X, causal if keys is None else keys & causal), expected) <= TOL


def test_the_package_without_biases_loads_too():
    package, ours = package_and_scratch(12, 3, bias=False)
    assert set(ours.state_dict()) == {"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"}
    X = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        assert gap(ours(X), package(X)) <= TOL


def test_the_layers_weights_match_the_books_matrices():
    """``W.weight.T`` of each scratch map is the book's matrix: the package's ``weights``, and the loop
    over heads of ``multi_head_attention_reference`` (no biases) gives the same output."""
    package, ours = package_and_scratch(12, 3, bias=False, seed=2)
    for name, W in package.weights.items():
        assert torch.equal(getattr(ours, name).weight.T, W)
    X = torch.randn(2, 5, 12, dtype=torch.float64)
    mask = make_mask("random", 2, 5)
    reference = tc.multihead.multi_head_attention_reference(X, **package.weights, H=3, mask=mask)
    with torch.no_grad():
        assert gap(ours(X, mask), reference) <= TOL


def torch_from_scratch(ours: scratch.MultiHeadAttention, D: int, H: int, bias: bool):
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True, dtype=torch.float64).eval()
    maps = (ours.W_q, ours.W_k, ours.W_v)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([W.weight for W in maps]))  # (3D, D), (out, in)
        theirs.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([W.bias for W in maps]))
            theirs.out_proj.bias.copy_(ours.W_o.bias)
    return theirs


@pytest.mark.parametrize(("B", "N", "D", "H"), SHAPES)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_equals_torch(B, N, D, H, kind, bias):
    torch.manual_seed(3)
    ours = scratch.MultiHeadAttention(D, H, bias=bias).double()
    theirs = torch_from_scratch(ours, D, H, bias)
    X = torch.randn(B, N, D, dtype=torch.float64)
    mask = make_mask(kind, B, N)
    # PyTorch's boolean attn_mask is the opposite convention: True = may NOT attend; a 3-D one is
    # (B*H, N, N) with batch b, head h at row b*H + h
    if mask is None:
        hidden = None
    else:
        hidden = ~mask if mask.dim() == 2 else (~mask).repeat_interleave(H, dim=0)
    with torch.no_grad():
        expected, _ = theirs(X, X, X, attn_mask=hidden, need_weights=False)
        assert gap(ours(X, mask), expected) <= TOL


# ----------------------------------------------------------------------------------------------
# Head == the package's single head == a loop over query rows


@pytest.mark.parametrize(("B", "N", "D", "d_k"), [(1, 1, 4, 4), (2, 5, 8, 3), (3, 7, 6, 6)])
@pytest.mark.parametrize("kind", MASKS)
def test_head_equals_the_package_single_head_functions(B, N, D, d_k, kind):
    g = torch.Generator().manual_seed(4)
    W_q, W_k, W_v = (torch.randn(D, d_k, generator=g, dtype=torch.float64) for _ in range(3))
    head = scratch.Head(D, d_k, bias=False).double()
    # nn.Linear stores (out, in): the transpose of the book's X @ W_q
    head.load_state_dict({"W_q.weight": W_q.T, "W_k.weight": W_k.T, "W_v.weight": W_v.T})
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    mask = make_mask(kind, B, N)
    with torch.no_grad():
        Y = head(X, mask)
    assert gap(Y, tc.self_attention.single_head_reference(X, W_q, W_k, W_v, mask)) <= TOL
    assert gap(Y, tc.self_attention.single_head(X, W_q, W_k, W_v, mask)) <= TOL


@pytest.mark.parametrize(("B", "N", "D"), [(1, 1, 4), (2, 5, 8), (3, 7, 6)])
@pytest.mark.parametrize("kind", MASKS)
def test_head_is_the_package_layer_with_one_head_before_W_o(B, N, D, kind):
    """With H = 1 the package's layer is one head of width D (biases included), then ``out_proj``."""
    package, _ = package_and_scratch(D, 1, seed=5)
    head = scratch.Head(D, D).double()
    state = scratch_state(package)
    head.load_state_dict({k: v for k, v in state.items() if not k.startswith("W_o")}, strict=True)
    X = torch.randn(B, N, D, dtype=torch.float64)
    mask = make_mask(kind, B, N)
    with torch.no_grad():
        assert gap(package.out_proj(head(X, mask)), package(X, mask)) <= TOL


def rows_by_hand(head: scratch.Head, X: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) V one query row at a time, the hidden keys left out."""
    Q, K, V = (X @ W.weight.T + W.bias for W in (head.W_q, head.W_k, head.W_v))
    B, N, _ = X.shape
    Y = torch.empty_like(V)
    for b in range(B):
        for n in range(N):
            keep = torch.ones(N, dtype=torch.bool) if mask is None else mask.expand(B, N, N)[b, n]
            s = K[b, keep] @ Q[b, n] / math.sqrt(head.d_k)  # the scores of query n
            a = torch.exp(s - s.max())
            Y[b, n] = (a / a.sum()) @ V[b, keep]  # y_n = sum over visible m of a_nm v_m
    return Y


@pytest.mark.parametrize(("B", "N", "D", "d_k"), [(1, 1, 4, 2), (2, 5, 8, 3), (3, 7, 6, 6)])
@pytest.mark.parametrize("kind", MASKS)
def test_head_equals_a_loop_over_query_rows(B, N, D, d_k, kind):
    torch.manual_seed(6)
    head = scratch.Head(D, d_k).double()
    X = torch.randn(B, N, D, dtype=torch.float64)
    mask = make_mask(kind, B, N)
    with torch.no_grad():
        assert gap(head(X, mask), rows_by_hand(head, X, mask)) <= TOL


# ----------------------------------------------------------------------------------------------
# The comparison fails for a realistic mistake


def by_hand(ours: scratch.MultiHeadAttention, X: torch.Tensor, transpose: bool) -> torch.Tensor:
    """The scratch forward (no mask) with the heads split as written, or by a reshape alone."""
    B, N, D = X.shape
    H, d_k = ours.H, ours.d_k

    def split(T):
        if transpose:
            return T.view(B, N, H, d_k).transpose(1, 2)  # (B, H, N, d_k): right
        return T.view(B, H, N, d_k)  # the same shape, but mixes the tokens' features: wrong

    Q, K, V = split(ours.W_q(X)), split(ours.W_k(X)), split(ours.W_v(X))
    A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return ours.W_o((A @ V).transpose(1, 2).reshape(B, N, D))


@pytest.mark.parametrize(("B", "N", "D", "H"), [(2, 5, 8, 2), (3, 7, 12, 4), (2, 6, 16, 16)])
def test_a_split_without_the_transpose_is_caught(B, N, D, H):
    package, ours = package_and_scratch(D, H, seed=7)
    X = torch.randn(B, N, D, dtype=torch.float64)
    with torch.no_grad():
        expected = package(X)
        assert gap(by_hand(ours, X, transpose=True), expected) <= TOL
        assert gap(by_hand(ours, X, transpose=False), expected) > 1e-3


@pytest.mark.parametrize(("B", "N", "D", "H"), [(2, 5, 8, 1), (2, 1, 8, 4)])
def test_the_wrong_split_is_invisible_with_one_head_or_one_token(B, N, D, H):
    """With H = 1 or N = 1 the two views read the same memory: the tests need H > 1 and N > 1."""
    package, ours = package_and_scratch(D, H, seed=8)
    X = torch.randn(B, N, D, dtype=torch.float64)
    with torch.no_grad():
        assert gap(by_hand(ours, X, transpose=False), package(X)) <= TOL
