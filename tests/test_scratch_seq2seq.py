"""``scratch/seq2seq.py`` equals the package's ``Seq2Seq`` (weights loaded by name) and PyTorch's
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (pre-norm, GELU), in float64."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from torch import nn

from transformer_course.encoder_decoder import Seq2Seq, Seq2SeqConfig
from transformer_course.scratch import seq2seq as scratch

TOL = 1e-12
BOS, EOS = 1, 2

CONFIGS = [  # src_vocab, tgt_vocab, src_len, tgt_len, d_model, H, L_e, L_d (pad_id 0 unless given)
    Seq2SeqConfig(11, 9, 7, 6, d_model=16, H=4, n_encoder_layers=1, n_decoder_layers=1),
    Seq2SeqConfig(13, 13, 9, 8, d_model=24, H=3, n_encoder_layers=2, n_decoder_layers=3),
    Seq2SeqConfig(7, 10, 5, 9, d_model=8, H=1, n_encoder_layers=3, n_decoder_layers=2, pad_id=4),
]


def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter random, LayerNorm gains and all biases too, so a wrong mapping cannot pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if re.search(r"(norm\d?|ln\d?)\.weight$", name):
                p.copy_(1 + 0.3 * r)  # LayerNorm gains around 1
            elif p.dim() == 1:
                p.copy_(0.3 * r)  # biases (LayerNorm's and the linear layers')
            elif re.search(r"emb|pos", name):
                p.copy_(r)  # embeddings and position tables
            else:
                p.copy_(r / math.sqrt(p.shape[1]))  # weight matrices (out, in)
    return module


RENAMES = [  # package name -> scratch name, applied in turn
    (r"^src_emb\.", "E_src."),
    (r"^tgt_emb\.", "E_tgt."),
    (r"^src_pos\.table\.", "R_src."),
    (r"^tgt_pos\.table\.", "R_tgt."),
    (r"^encoder\.final_norm\.", "ln_enc."),
    (r"^decoder\.final_norm\.", "ln_dec."),
    (r"^(encoder|decoder)\.blocks\.", r"\1."),
    (r"\.norm(\d)\.", r".ln\1."),
    (r"\.out_proj\.", ".W_o."),
    (r"^head\.", "W_vocab."),
]


def to_scratch(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The package's state dict under the scratch names; fused ``in_proj`` splits into ``W_q, W_k, W_v``."""
    out = {}
    for name, T in state.items():
        for pattern, repl in RENAMES:
            name = re.sub(pattern, repl, name)
        if ".in_proj." in name:  # rows [W_q; W_k; W_v] (nn.Linear stores (out, in))
            for x, part in zip("qkv", T.chunk(3, dim=0), strict=True):
                out[name.replace(".in_proj.", f".W_{x}.")] = part
        else:
            out[name] = T
    return out


def pair(config: Seq2SeqConfig, seed: int) -> tuple[Seq2Seq, scratch.Seq2Seq]:
    """The package's model with seeded random weights and the scratch model loaded from it."""
    ref = randomize(Seq2Seq(config).double().eval(), seed)
    ours = scratch.Seq2Seq(config).double().eval()
    ours.load_state_dict(to_scratch(ref.state_dict()), strict=True)
    return ref, ours


def batch(config, B, M, N, g) -> tuple[torch.Tensor, torch.Tensor]:
    """``src (B, M)``: right padding and a few padded tokens inside, at least one real token each;
    ``tgt_in (B, N)``: BOS, tokens, right padding."""
    pad = config.pad_id

    def tokens(vocab, shape):
        T = torch.randint(0, vocab - 1, shape, generator=g)
        return T + (T >= pad).long()  # every id but the pad id

    src = tokens(config.src_vocab, (B, M))
    src_len = torch.randint(1, M + 1, (B,), generator=g)
    src[torch.arange(M)[None, :] >= src_len[:, None]] = pad
    inside = torch.rand(B, M, generator=g) < 0.2
    inside[:, 0] = False  # position 0 stays real
    src[inside] = pad
    tgt = tokens(config.tgt_vocab, (B, N))
    tgt[:, 0] = BOS
    tgt_len = torch.randint(1, N + 1, (B,), generator=g)
    tgt[torch.arange(N)[None, :] >= tgt_len[:, None]] = pad
    return src, tgt


def assert_equal(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    err = (ours - theirs).abs().max().item()
    assert err <= TOL, f"largest difference {err:.3g} > {TOL}"


@pytest.mark.parametrize("k", range(len(CONFIGS)))
@pytest.mark.parametrize("B", [1, 4])
def test_logits_equal_the_package_with_padding(k, B):
    config = CONFIGS[k]
    ref, ours = pair(config, seed=k)
    g = torch.Generator().manual_seed(10 * k + B)
    padded = 0
    for M, N in [(1, 1), (config.src_len, config.tgt_len), (config.src_len - 2, 3), (2, 1)]:
        src, tgt_in = batch(config, B, M, N, g)
        padded += int((src == config.pad_id).sum() + (tgt_in == config.pad_id).sum())
        with torch.no_grad():
            assert_equal(ours(src, tgt_in), ref(src, tgt_in)[0])
    assert B == 1 or padded > 0  # the masks were exercised


def test_the_scratch_masks_hide_source_padding():
    """A padded source's real target positions equal those of the source without its padding."""
    config = CONFIGS[1]
    _, ours = pair(config, seed=5)
    src = torch.tensor([[3, 5, 7, 0, 0, 0]])
    tgt_in = torch.tensor([[BOS, 4, 6]])
    with torch.no_grad():
        assert_equal(ours(src, tgt_in), ours(src[:, :3], tgt_in))


def test_greedy_decoding_gives_the_packages_tokens():
    ended_early = ran_to_the_end = 0
    for k, config in enumerate(CONFIGS):
        for seed in range(4):
            ref, ours = pair(config, seed=100 + seed)
            g = torch.Generator().manual_seed(10 * k + seed)
            src, _ = batch(config, 6, config.src_len, 1, g)
            got = scratch.greedy_decode(ours, src, BOS, EOS)
            assert torch.equal(got, ref.greedy_decode(src, BOS, EOS))  # with the package's cache
            assert torch.equal(got, ref.greedy_decode(src, BOS, EOS, use_cache=False))
            early = (got[:, 1:-1] == EOS).any(dim=1)
            ended_early += int(early.sum())
            ran_to_the_end += int((~early).sum())
    # rows padded after their EOS, and rows that ran to tgt_len tokens
    assert ended_early > 0 and ran_to_the_end > 0


def to_torch_attention(state: dict[str, torch.Tensor], ours: str, theirs: str) -> dict:
    """A scratch attention's ``W_q, W_k, W_v, W_o`` as ``nn.MultiheadAttention``'s fused weights."""
    return {
        f"{theirs}.in_proj_weight": torch.cat([state[f"{ours}.W_{x}.weight"] for x in "qkv"]),
        f"{theirs}.in_proj_bias": torch.cat([state[f"{ours}.W_{x}.bias"] for x in "qkv"]),
        f"{theirs}.out_proj.weight": state[f"{ours}.W_o.weight"],
        f"{theirs}.out_proj.bias": state[f"{ours}.W_o.bias"],
    }


def to_torch_layer(block: nn.Module, attentions: dict[str, str], n_norms: int) -> dict:
    s = block.state_dict()
    out = {}
    for ours, theirs in attentions.items():
        out |= to_torch_attention(s, ours, theirs)
    for i in (1, 2):
        out |= {f"linear{i}.{w}": s[f"mlp.fc{i}.{w}"] for w in ("weight", "bias")}
    for i in range(1, n_norms + 1):
        out |= {f"norm{i}.{w}": s[f"ln{i}.{w}"] for w in ("weight", "bias")}
    return out


# PyTorch's layers default to ReLU: GELU (exact, F.gelu) is set to match; LayerNorm eps is 1e-5 in both.
TORCH_LAYER = dict(dropout=0.0, activation="gelu", batch_first=True, norm_first=True)


@pytest.mark.parametrize("D, H, B, N, M", [(16, 4, 3, 5, 7), (12, 3, 2, 6, 4), (8, 1, 1, 1, 3)])
# Without grad, PyTorch's encoder layer takes its fused fast path; with grad, the plain one.
@pytest.mark.parametrize("grad", [False, True])
def test_blocks_equal_torchs_layers(D, H, B, N, M, grad):
    g = torch.Generator().manual_seed(D + N)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[-1, M // 2 + 1 :] = False  # the last source is padded; every source keeps a real token
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    X_src = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    X_mem = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    causal = torch.ones(N, N, dtype=torch.bool).tril()

    enc = randomize(scratch.EncoderBlock(D, H).double().eval(), seed=D)
    torch_enc = nn.TransformerEncoderLayer(D, H, 4 * D, dtype=torch.float64, **TORCH_LAYER).eval()
    torch_enc.load_state_dict(to_torch_layer(enc, {"attn": "self_attn"}, 2), strict=True)
    dec = randomize(scratch.DecoderBlock(D, H).double().eval(), seed=D + 1)
    torch_dec = nn.TransformerDecoderLayer(D, H, 4 * D, dtype=torch.float64, **TORCH_LAYER).eval()
    names = {"self_attn": "self_attn", "cross_attn": "multihead_attn"}
    torch_dec.load_state_dict(to_torch_layer(dec, names, 3), strict=True)

    with torch.set_grad_enabled(grad):  # PyTorch's boolean masks: True = may NOT attend
        theirs = torch_enc(X_src, src_key_padding_mask=~keep)
        assert_equal(enc(X_src, keep[:, None, :]), theirs)  # padded positions included
        theirs = torch_dec(X, X_mem, tgt_mask=~causal, memory_key_padding_mask=~keep)
        assert_equal(dec(X, X_mem, causal, keep[:, None, :]), theirs)


class KeysValuesFromTheDecoder(scratch.DecoderBlock):
    """The slip: cross-attention reads the decoder stream for its keys and values, not the memory."""

    def forward(self, X, X_mem, causal, mem_mask):
        Xn = self.ln1(X)
        X1 = X + self.self_attn(Xn, Xn, Xn, causal)
        Xt = self.ln2(X1)
        X2 = X1 + self.cross_attn(Xt, Xt, Xt)  # K, V from LN_2(X'), not from X_mem
        return X2 + self.mlp(self.ln3(X2))


def test_cross_attention_reading_the_decoder_stream_is_rejected():
    config = CONFIGS[1]
    ref, ours = pair(config, seed=7)
    wrong = copy.deepcopy(ours)
    for block in wrong.decoder:
        block.__class__ = KeysValuesFromTheDecoder
    src, tgt_in = batch(config, 3, config.src_len, config.tgt_len, torch.Generator().manual_seed(7))
    with torch.no_grad():
        theirs = ref(src, tgt_in)[0]
        assert_equal(ours(src, tgt_in), theirs)
        err = (wrong(src, tgt_in) - theirs).abs().max().item()
    assert err > 1e-3, f"the wrong variant differs by only {err:.3g}"
