"""A masked language model from scratch (chapter *Masked models*; Devlin et al. 2019): the 80/10/10
corruption, an encoder of pre-norm blocks with no causal mask, and the loss on the chosen positions.

The package's ``tc.masked`` (``mask_tokens``, ``MaskedLM``, ``mlm_loss``) computes the same; ``BERT``
takes its config (``vocab_size`` counting ``[MASK]``, ``block_size``, ``n_layers``, ``H``, ``d_model``,
``dropout``, ``tie_weights``) and ``tests/test_scratch_bert.py`` loads its weights and proves both equal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # the target of a position that is not scored (cross_entropy's ignore_index)


def mask_tokens(s, vocab_size, mask_id, rho=0.15, generator=None):
    """Corrupt the token ids ``s`` (any shape, real tokens ``0..vocab_size-1``), eq. (eq-mlm-corrupt).

    Returns ``(s_tilde, targets, c)``: what the model reads, the original token at each chosen position
    (``IGNORE_INDEX`` elsewhere), and the bool mask ``c`` of chosen positions.
    """
    # draws on the CPU from `generator` (as the package: one seed, one batch on every device)
    u = torch.rand(s.shape, generator=generator).to(s.device)  # u_{i,n}: is position n chosen?
    v = torch.rand(s.shape, generator=generator).to(s.device)  # v_{i,n}: how is it replaced?
    w = torch.randint(vocab_size, s.shape, generator=generator).to(s.device)  # w_{i,n}: real token
    c = u < rho  # c_{i,n} = [u_{i,n} < rho]
    s_tilde = torch.where(c & (v < 0.8), mask_id, s)  # 80 % of the chosen: [MASK]
    s_tilde = torch.where(c & (v >= 0.8) & (v < 0.9), w.to(s.dtype), s_tilde)  # 10 %: random token
    targets = torch.where(c, s, IGNORE_INDEX)  # the other 10 % keep their token, but are scored
    return s_tilde, targets, c


class SelfAttention(nn.Module):
    """Multi-head self-attention with no mask: every position reads every position."""

    def __init__(self, D, H, dropout=0.0):
        super().__init__()
        self.H = H
        self.W_q, self.W_k, self.W_v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.W_o = nn.Linear(D, D)  # mixes the concatenated heads
        self.drop = nn.Dropout(dropout)  # on the attention weights

    def forward(self, X):
        B, N, D = X.shape
        H, d_k = self.H, D // self.H
        Q = self.W_q(X).view(B, N, H, d_k).transpose(1, 2)  # (B, N, D) -> (B, H, N, d_k)
        K = self.W_k(X).view(B, N, H, d_k).transpose(1, 2)  # (B, N, D) -> (B, H, N, d_k)
        V = self.W_v(X).view(B, N, H, d_k).transpose(1, 2)  # (B, N, D) -> (B, H, N, d_k)
        A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d_k), dim=-1)  # (B, H, N, N), no mask
        Y = (self.drop(A) @ V).transpose(1, 2).reshape(B, N, D)  # (B, H, N, d_k) -> (B, N, H d_k)
        return self.W_o(Y)  # (B, N, D)


class Block(nn.Module):
    """A pre-norm encoder block: Z = X + MHSA(LN_1(X)), X~ = Z + MLP(LN_2(Z)) (eq-block-prenorm)."""

    def __init__(self, D, H, dropout=0.0):
        super().__init__()
        self.LN_1, self.LN_2 = nn.LayerNorm(D), nn.LayerNorm(D)  # gamma, beta; eps = 1e-5
        self.attn = SelfAttention(D, H, dropout)
        self.W_1, self.W_2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)  # the MLP, d_ff = 4 D
        self.drop = nn.Dropout(dropout)  # on each branch, before the residual sum

    def forward(self, X):
        Z = X + self.drop(self.attn(self.LN_1(X)))  # (B, N, D)
        return Z + self.drop(self.W_2(F.gelu(self.W_1(self.LN_2(Z)))))  # (B, N, D), exact GELU


class BERT(nn.Module):
    """Token embedding ``E``, learned positions ``R``, ``L`` encoder blocks, a final LayerNorm and the
    output map ``W_vocab`` (tied to ``E`` when ``config.tie_weights``), as ``tc.masked.MaskedLM``.

    ``forward(s_tilde (B, N), targets (B, N) | None) -> (logits (B, N, |V|), loss | None)``.
    """

    def __init__(self, config):
        super().__init__()
        c = config
        self.E = nn.Embedding(c.vocab_size, c.d_model)  # (|V|, D), [MASK] included
        self.R = nn.Embedding(c.block_size, c.d_model)  # (C, D): one learned vector per position
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c.d_model, c.H, c.dropout) for _ in range(c.n_layers))
        self.LN_f = nn.LayerNorm(c.d_model)  # a pre-norm stream is never normalised otherwise
        self.W_vocab = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.W_vocab.weight = self.E.weight  # W_vocab = E^T (Press & Wolf 2017)
        self.apply(self.gpt2_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("W_o.weight", "W_2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def gpt2_init(module):
        """GPT-2's initialisation, as the package's: N(0, 0.02) weights, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, s_tilde, targets=None):
        positions = torch.arange(s_tilde.shape[1], device=s_tilde.device)  # 0..N-1
        X = self.drop(self.E(s_tilde) + self.R(positions))  # (B, N, D) + (N, D)
        for block in self.blocks:
            X = block(X)  # (B, N, D)
        logits = self.W_vocab(self.LN_f(X))  # (B, N, |V|)
        if targets is None:
            return logits, None
        # eq. (eq-mlm-loss): the mean over the chosen positions only; the others are IGNORE_INDEX
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss
