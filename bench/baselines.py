"""What a user would run instead of the course's model, for the benchmarks to compare against.

``NanoGPT`` is a minimal model in the style of nanoGPT's ``model.py`` (Karpathy 2022): pre-norm blocks
with one fused QKV projection and PyTorch's ``scaled_dot_product_attention``, a GELU MLP, learned
positions and a tied head. It is written independently of the course's package on purpose: it is the
yardstick, not a second implementation to teach from. Hugging Face's ``GPT2LMHeadModel`` (built from a
config, random weights: nothing is downloaded) is the other yardstick, via :func:`hf_gpt2`.
``SDPASelfAttention`` is the attention layer alone, written the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    def __init__(self, d: int, h: int, p: float) -> None:
        super().__init__()
        self.h, self.p = h, p
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class SDPASelfAttention(nn.Module):
    """Multi-head self-attention as a user writes it on top of PyTorch's fused kernel: one ``Linear`` to
    queries, keys and values, ``F.scaled_dot_product_attention``, one output ``Linear`` (no mask)."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class NanoGPT(nn.Module):
    """A nanoGPT-style language model: ``forward(idx, targets) -> (logits, loss)``."""

    def __init__(self, vocab: int, context: int, n_layer: int, n_head: int, d: int, p: float):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(_Block(d, n_head, p) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, w in self.named_parameters():
            if w.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(w, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def hf_gpt2(vocab: int, context: int, n_layer: int, n_head: int, d: int):
    """Hugging Face's ``GPT2LMHeadModel`` of these sizes with random weights, in evaluation mode.

    Dropout off; the exact GELU, as in the course's model (GPT-2's default is the tanh
    approximation). Raises ``ImportError`` with the install command when ``transformers`` is missing.
    """
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "the comparison with Hugging Face needs transformers: pip install -e '.[bench]'"
        ) from err
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=context,
        n_embd=d,
        n_layer=n_layer,
        n_head=n_head,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()
