"""``scratch/bert.py`` equals the package's masked language model (``tc.masked``) in float64: the same
corruption for the same generator seed, the same logits and loss with the package's weights loaded by
name, and its encoder block equal to ``nn.TransformerEncoderLayer``. A wrong variant (the loss over every
position, a causal mask left in, a wrong weight mapping) is rejected by the same comparisons."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.block import ACTIVATIONS, PreNormBlock
from transformer_course.language_models import GPT, GPTConfig
from transformer_course.masked import IGNORE_INDEX, MLM_CPU_RECIPE, MaskedLM, mask_tokens
from transformer_course.scratch import bert

TOL = 1e-12
CONFIGS = [
    GPTConfig(vocab_size=21, block_size=16, n_layers=2, H=2, d_model=32, dropout=0.0),
    GPTConfig(
        vocab_size=11, block_size=12, n_layers=1, H=4, d_model=16, dropout=0.1, tie_weights=False
    ),
    GPTConfig(vocab_size=7, block_size=9, n_layers=3, H=1, d_model=8, dropout=0.2),
    dataclasses.replace(
        MLM_CPU_RECIPE.model, vocab_size=66
    ),  # the chapter's model, 65 chars + [MASK]
]
BLOCK = {  # package name inside a block -> scratch name (the fused in_proj is split below)
    "attn.out_proj": "attn.W_o",
    "mlp.fc1": "W_1",
    "mlp.fc2": "W_2",
    "norm1": "LN_1",
    "norm2": "LN_2",
}
TOP = {"tok_emb": "E", "pos_emb.table": "R", "stack.final_norm": "LN_f", "lm_head": "W_vocab"}


def to_scratch(state: dict[str, torch.Tensor], qkv=("W_q", "W_k", "W_v")) -> dict:
    """The package's ``MaskedLM`` state dict under the scratch ``BERT``'s names; ``in_proj``
    (``[W_q^T; W_k^T; W_v^T]`` stacked by rows) is split into the three ``nn.Linear`` layers."""
    out = {}
    for name, t in state.items():
        module, kind = name.rsplit(".", 1)  # kind: weight or bias
        if module in TOP:
            out[f"{TOP[module]}.{kind}"] = t
            continue
        _, _, ell, inner = module.split(".", 3)  # stack.blocks.<ell>.<inner>
        if inner == "attn.in_proj":
            for W, part in zip(qkv, t.chunk(3, dim=0), strict=True):
                out[f"blocks.{ell}.attn.{W}.{kind}"] = part
        else:
            out[f"blocks.{ell}.{BLOCK[inner]}.{kind}"] = t
    return out


def randomize_(model: nn.Module, gen: torch.Generator, scale: float = 0.3) -> nn.Module:
    """Every parameter random (LayerNorm gains around 1, every bias nonzero), so that a mapping that
    swaps two LayerNorms, two biases or two projections cannot pass."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = scale * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            is_gain = p.dim() == 1 and name.endswith("weight")  # a LayerNorm's gamma
            p.copy_(noise + 1.0 if is_gain else noise)
    return model


def models(config: GPTConfig, seed: int = 0, qkv=("W_q", "W_k", "W_v")):
    """The package's ``MaskedLM`` with seeded random weights and the scratch ``BERT`` loaded with
    them, both float64 and in evaluation mode."""
    torch.manual_seed(seed)
    package = MaskedLM(config).double().eval()
    randomize_(package, torch.Generator().manual_seed(seed))
    scratch = bert.BERT(config).double().eval()
    scratch.load_state_dict(to_scratch(package.state_dict(), qkv), strict=True)
    return package, scratch


def batch(config: GPTConfig, B: int, N: int, seed: int):
    """Real-token ids ``(B, N)``, their corruption and targets by the package (at least one chosen
    position per sequence, so that the loss is defined)."""
    g = torch.Generator().manual_seed(seed)
    V = config.vocab_size - 1  # the real tokens; [MASK] is id V
    ids = torch.randint(V, (B, N), generator=g)
    corrupted, targets, _ = mask_tokens(ids, V, V, 0.4, g)
    targets[:, 0] = ids[:, 0]  # position 0 scored in every sequence
    return ids, corrupted, targets


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ----------------------------------------------------------------------------------------------
# The model: logits and loss equal to the package's


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"L{c.n_layers}H{c.H}D{c.d_model}")
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, None)], ids=["B1N1", "B3N5", "B2Nfull"])
def test_scratch_bert_equals_the_package_masked_lm(config, shape):
    package, scratch = models(config, seed=config.n_layers)
    B, N = shape[0], shape[1] or config.block_size
    _, x, targets = batch(config, B, N, seed=B * 100 + N)
    with torch.no_grad():
        logits_p, loss_p = package(x, targets)
        logits_s, loss_s = scratch(x, targets)
        assert scratch(x)[1] is None
    assert logits_s.dtype == torch.float64 and logits_s.shape == (B, N, config.vocab_size)
    assert max_diff(logits_s, logits_p) <= TOL
    assert abs(loss_s.item() - loss_p.item()) <= TOL
    assert (scratch.W_vocab.weight is scratch.E.weight) == config.tie_weights


def test_the_package_config_works_duck_typed():
    """The scratch model reads only the config's attributes: the package's frozen dataclass and a
    plain namespace with the same fields build the same model."""
    config = CONFIGS[1]
    torch.manual_seed(3)
    a = bert.BERT(config)
    torch.manual_seed(3)
    b = bert.BERT(types.SimpleNamespace(**dataclasses.asdict(config)))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_initialisation_follows_the_package():
    """A fresh scratch model has the package's parameters (every name, shape, tie) and GPT-2's
    initial distribution: LayerNorms 1 and 0, zero biases, N(0, 0.02) weights, the residual
    projections ``W_o`` and ``W_2`` scaled by 1/sqrt(2L). Stds agree within sampling error."""
    config = dataclasses.replace(CONFIGS[0], n_layers=4)
    torch.manual_seed(0)
    package = to_scratch(MaskedLM(config).state_dict())
    scratch = bert.BERT(config).state_dict()
    assert package.keys() == scratch.keys()
    for name, p in package.items():
        s = scratch[name]
        assert s.shape == p.shape, name
        if p.std() == 0:  # LayerNorm's 1 and 0, zero biases
            assert torch.equal(s, p), name
        else:
            assert abs(s.std().item() / p.std().item() - 1) < 6 / math.sqrt(p.numel()), name


def test_dropout_sits_where_the_package_has_it():
    """The package drops after the embeddings, on the attention weights and on each branch before its
    residual sum; the scratch model has the same probability at the same places (evaluation mode
    switches them all off, which the equality tests rely on)."""
    config = CONFIGS[2]
    package, scratch = MaskedLM(config), bert.BERT(config)
    assert package.drop.p == scratch.drop.p == config.dropout
    for pb, sb in zip(package.stack.blocks, scratch.blocks, strict=True):
        assert pb.attn.dropout == sb.attn.drop.p == pb.drop1.p == pb.drop2.p == sb.drop.p
    _, x, targets = batch(config, 4, config.block_size, seed=0)
    scratch.train()
    torch.manual_seed(0)
    first = scratch(x, targets)[1]
    assert not torch.equal(first, scratch(x, targets)[1])  # dropout is on while training


# ----------------------------------------------------------------------------------------------
# The corruption: the same draws as the package's


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("p", [0.15, 0.5, 1.0])
@pytest.mark.parametrize("V", [2, 20, 65])
def test_scratch_corruption_equals_the_package(seed, p, V):
    ids = torch.randint(V, (5, 37), generator=torch.Generator().manual_seed(seed + 100))
    g_p, g_s = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    x_p, targets_p, chosen_p = mask_tokens(ids, V, V, p, g_p)
    x_s, targets_s, chosen_s = bert.mask_tokens(ids, V, V, p, g_s)
    assert torch.equal(x_s, x_p)
    assert torch.equal(targets_s, targets_p)
    assert torch.equal(chosen_s, chosen_p)
    assert torch.equal(g_s.get_state(), g_p.get_state())  # the same number of draws, consumed alike


def test_scratch_corruption_keeps_any_shape_and_the_global_generator():
    ids = torch.randint(9, (2, 3, 11), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    package = mask_tokens(ids, 9, 9, 0.3)
    torch.manual_seed(5)
    scratch = bert.mask_tokens(ids, 9, 9, 0.3)
    assert all(torch.equal(a, b) for a, b in zip(scratch, package, strict=True))


def _within(count: int, n: int, q: float, sds: float = 5.0) -> bool:
    """``count`` successes of ``n`` Bernoulli(q) draws lie within ``sds`` binomial sds of ``n q``."""
    return abs(count - n * q) <= sds * math.sqrt(n * q * (1 - q))


def test_scratch_corruption_statistics_are_80_10_10_of_a_rho_share(gen):
    V, rho = 20, 0.15
    ids = torch.randint(V, (400, 500), generator=gen)  # 200,000 positions
    x, targets, chosen = bert.mask_tokens(ids, V, V, rho, gen)
    n, k = ids.numel(), int(chosen.sum())
    masked = chosen & (x == V)
    changed = chosen & (x != V) & (x != ids)  # a random token unlike the original
    kept = chosen & (x == ids)  # the kept 10 %, and random draws that hit the original (1/|V|)
    assert _within(k, n, rho)
    assert _within(int(masked.sum()), k, 0.8)
    assert _within(int(changed.sum()), k, 0.1 * (1 - 1 / V))
    assert _within(int(kept.sum()), k, 0.1 + 0.1 / V)
    assert not _within(int(masked.sum()), k, 0.75)  # the bound is tight enough to see 75 %
    assert torch.equal(x[~chosen], ids[~chosen])  # unchosen positions never change
    assert torch.equal(targets[chosen], ids[chosen])
    assert (targets[~chosen] == IGNORE_INDEX).all()


# ----------------------------------------------------------------------------------------------
# The encoder block: PyTorch's nn.TransformerEncoderLayer


@pytest.mark.parametrize("D,H", [(32, 2), (16, 4), (8, 1)])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_scratch_block_equals_torch_encoder_layer(D, H, grad):
    """Configured as the package's blocks: pre-norm (``norm_first=True``), exact GELU, ``d_ff = 4D``,
    LayerNorm eps 1e-5, no mask. With grad enabled PyTorch takes its reference path; under no_grad in
    evaluation mode its fused fast path (``torch._transformer_encoder_layer_fwd``, float64 included):
    both agree with the scratch block."""
    reference = MaskedLM(GPTConfig(vocab_size=5, block_size=4, n_layers=1, H=H, d_model=D))
    ours = reference.stack.blocks[0]
    assert isinstance(ours, PreNormBlock) and not ours.attn.causal
    (activation,) = [name for name, f in ACTIVATIONS.items() if f is ours.mlp.act]
    block = randomize_(bert.Block(D, H).double().eval(), torch.Generator().manual_seed(D + H))
    layer = nn.TransformerEncoderLayer(
        D, H, dim_feedforward=4 * D, dropout=0.0, activation=activation, layer_norm_eps=1e-5,
        batch_first=True, norm_first=isinstance(ours, PreNormBlock), dtype=torch.float64,
    ).eval()  # fmt: skip
    with torch.no_grad():
        a = block.attn
        layer.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        layer.self_attn.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
        pairs = [
            (layer.self_attn.out_proj, a.W_o),
            (layer.linear1, block.W_1),
            (layer.linear2, block.W_2),
            (layer.norm1, block.LN_1),
            (layer.norm2, block.LN_2),
        ]
        for theirs, mine in pairs:
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    X = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        assert max_diff(block(X), layer(X)) <= TOL


# ----------------------------------------------------------------------------------------------
# Wrong variants: the comparisons reject them


def test_the_loss_over_every_position_is_rejected():
    """What a learner writes first: the cross-entropy on every position against the original ids
    (or the chosen ones' sum divided by all B N positions). Both miss the package's loss."""
    config = CONFIGS[0]
    package, scratch = models(config)
    ids, x, targets = batch(config, 4, config.block_size, seed=0)
    with torch.no_grad():
        logits, loss = scratch(x, targets)
        loss_p = package(x, targets)[1]
    assert abs(loss.item() - loss_p.item()) <= TOL
    every = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    assert abs(every.item() - loss_p.item()) > 1e-3
    summed = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / ids.numel()
    assert abs(summed.item() - loss_p.item()) > 1e-3


def test_a_causal_mask_left_in_the_encoder_is_rejected():
    """The GPT the masked model is made from, with the very same weights: only its causal mask
    differs, and its logits miss the scratch model's."""
    config = CONFIGS[0]
    package, scratch = models(config)
    gpt = GPT(config).double().eval()
    gpt.load_state_dict(package.state_dict(), strict=True)
    _, x, _ = batch(config, 2, config.block_size, seed=1)
    with torch.no_grad():
        logits_s = scratch(x)[0]
        assert max_diff(logits_s, package(x)[0]) <= TOL
        assert max_diff(logits_s, gpt(x)[0]) > 1e-3


@pytest.mark.parametrize("qkv", [("W_k", "W_q", "W_v"), ("W_q", "W_v", "W_k")])
def test_a_wrong_split_of_the_fused_projection_is_rejected(qkv):
    config = CONFIGS[0]
    package, scratch = models(config, qkv=qkv)
    _, x, _ = batch(config, 2, config.block_size, seed=2)
    with torch.no_grad():
        assert max_diff(scratch(x)[0], package(x)[0]) > 1e-3
