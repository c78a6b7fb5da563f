"""The encoder-decoder transformer from scratch (chapter *Encoder-decoder*), in forward order.

Pre-norm everywhere, as the package's ``Seq2Seq``: every sub-layer reads ``LN(X)`` and adds its output to
the residual stream, and the encoder and the decoder each end with a LayerNorm. Masks are boolean,
``True`` = may attend. ``config`` is anything with the fields of ``tc.encoder_decoder.Seq2SeqConfig``
(``dropout`` is not used: this file has no dropout). ``X_mem`` is the memory, the encoder's output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    """Queries from ``X``, keys from ``X_k``, values from ``X_v``: self-attention is the call
    ``attn(X, X, X, mask)``, cross-attention ``attn(X, X_mem, X_mem, mask)``."""

    def __init__(self, D: int, H: int) -> None:
        super().__init__()
        self.H, self.d_k = H, D // H
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, X: Tensor, X_k: Tensor, X_v: Tensor, mask: Tensor | None = None) -> Tensor:
        """``X (B, N, D)``, ``X_k, X_v (B, M, D)``; ``mask (N, M)``, ``(B, 1, M)`` or ``(B, N, M)``
        (with ``unsqueeze(-3)`` below, any mask that broadcasts to ``(B, H, N, M)``)."""
        B, N, D = X.shape
        M, H, d_k = X_k.shape[1], self.H, self.d_k
        # (B, N, D) -> (B, N, H, d_k) -> (B, H, N, d_k): head h gets features h d_k .. (h+1) d_k - 1
        Q = self.W_q(X).view(B, N, H, d_k).transpose(1, 2)
        K = self.W_k(X_k).view(B, M, H, d_k).transpose(1, 2)  # (B, M, D) -> (B, H, M, d_k)
        V = self.W_v(X_v).view(B, M, H, d_k).transpose(1, 2)  # (B, M, D) -> (B, H, M, d_k)
        S = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, N, M): the scores of every head
        if mask is not None:  # one mask for every head: (B, N, M) -> (B, 1, N, M)
            S = S.masked_fill(~mask.unsqueeze(-3), float("-inf"))  # weight exactly 0 after softmax
        A = torch.softmax(S, dim=-1)  # (B, H, N, M), each row sums to 1
        # (B, H, N, d_k) -> (B, N, H, d_k) -> (B, N, D): the heads side by side
        Y = (A @ V).transpose(1, 2).reshape(B, N, D)
        return self.W_o(Y)  # W_o mixes the heads


class MLP(nn.Module):
    """The token-wise MLP, ``GELU(X W_1 + b_1) W_2 + b_2`` (exact GELU, as the package)."""

    def __init__(self, D: int, d_ff: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, d_ff), nn.Linear(d_ff, D)

    def forward(self, X: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(X)))  # (B, N, D) -> (B, N, d_ff) -> (B, N, D)


class EncoderBlock(nn.Module):
    """Pre-norm: ``X' = X + MHSA(LN_1(X))``, ``Y = X' + MLP(LN_2(X'))``; no causal mask."""

    def __init__(self, D: int, H: int) -> None:
        super().__init__()
        self.attn, self.mlp = MultiHeadAttention(D, H), MLP(D, 4 * D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, X: Tensor, mask: Tensor) -> Tensor:
        Xn = self.ln1(X)
        X1 = X + self.attn(Xn, Xn, Xn, mask)  # X', (B, M, D)
        return X1 + self.mlp(self.ln2(X1))


class DecoderBlock(nn.Module):
    """Pre-norm, three sub-layers: masked self-attention, cross-attention to the memory, MLP."""

    def __init__(self, D: int, H: int) -> None:
        super().__init__()
        self.self_attn, self.cross_attn = MultiHeadAttention(D, H), MultiHeadAttention(D, H)
        self.mlp = MLP(D, 4 * D)
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, X: Tensor, X_mem: Tensor, causal: Tensor, mem_mask: Tensor) -> Tensor:
        """``X (B, N, D)``, ``X_mem (B, M, D)``, ``causal (N, N)``, ``mem_mask (B, 1, M)``."""
        Xn = self.ln1(X)
        X1 = X + self.self_attn(Xn, Xn, Xn, causal)  # X': query n sees the targets m <= n
        # X'': queries from LN_2(X'), keys and values from the memory X_mem
        X2 = X1 + self.cross_attn(self.ln2(X1), X_mem, X_mem, mem_mask)
        return X2 + self.mlp(self.ln3(X2))  # (B, N, D)


class Seq2Seq(nn.Module):
    """Embeddings plus learned positions, ``L_e`` encoder blocks and a LayerNorm (the memory), ``L_d``
    decoder blocks and a LayerNorm, then ``W_vocab`` (no bias, not tied to the embeddings)."""

    def __init__(self, config) -> None:
        super().__init__()
        c, D = config, config.d_model
        self.config = c
        self.E_src, self.E_tgt = nn.Embedding(c.src_vocab, D), nn.Embedding(c.tgt_vocab, D)
        self.R_src, self.R_tgt = nn.Embedding(c.src_len, D), nn.Embedding(c.tgt_len, D)  # positions
        self.encoder = nn.ModuleList(EncoderBlock(D, c.H) for _ in range(c.n_encoder_layers))
        self.ln_enc = nn.LayerNorm(D)
        self.decoder = nn.ModuleList(DecoderBlock(D, c.H) for _ in range(c.n_decoder_layers))
        self.ln_dec = nn.LayerNorm(D)
        self.W_vocab = nn.Linear(D, c.tgt_vocab, bias=False)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """``src (B, M)`` -> the memory ``X_mem (B, M, D)`` and ``keep (B, M)``, True = real token."""
        keep = src != self.config.pad_id  # (B, M); padding may sit anywhere, but not everywhere
        positions = torch.arange(src.shape[1], device=src.device)  # 0 .. M-1
        X = self.E_src(src) + self.R_src(positions)  # (B, M, D) + (M, D)
        mask = keep[:, None, :]  # (B, M) -> (B, 1, M): every query may attend to the real keys
        for block in self.encoder:
            X = block(X, mask)
        return self.ln_enc(X), keep

    def decode(self, tgt_in: Tensor, X_mem: Tensor, keep: Tensor) -> Tensor:
        """``tgt_in (B, N)`` and the memory -> logits ``(B, N, |V|)``."""
        N = tgt_in.shape[1]
        positions = torch.arange(N, device=tgt_in.device)
        X = self.E_tgt(tgt_in) + self.R_tgt(positions)  # (B, N, D) + (N, D)
        # Causal mask only, as the package: targets are padded on the right, so every padded key
        # lies in the future of every real query (the padded positions' logits are never read).
        causal = torch.ones(N, N, dtype=torch.bool, device=tgt_in.device).tril()  # (N, N): m <= n
        mem_mask = keep[:, None, :]  # (B, M) -> (B, 1, M): every query reads the real sources
        for block in self.decoder:
            X = block(X, X_mem, causal, mem_mask)
        return self.W_vocab(self.ln_dec(X))  # (B, N, D) -> (B, N, |V|)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, *self.encode(src))  # teacher forcing: every position at once


@torch.no_grad()
def greedy_decode(model: Seq2Seq, src: Tensor, bos: int, eos: int) -> Tensor:
    """``(B, tgt_len)`` ids: ``bos``, then the most likely next token at every step, padding after
    ``eos``; the whole prefix runs through the decoder at each step (no cache). As the package's
    ``Seq2Seq.greedy_decode``; put the model in eval mode first."""
    c, B = model.config, src.shape[0]
    X_mem, keep = model.encode(src)  # the source is encoded once
    out = torch.full((B, c.tgt_len), c.pad_id, dtype=torch.long, device=src.device)
    out[:, 0] = bos
    done = torch.zeros(B, dtype=torch.bool, device=src.device)  # True once a row has produced eos
    for t in range(1, c.tgt_len):
        nxt = model.decode(out[:, :t], X_mem, keep)[:, -1].argmax(dim=-1)  # (B,): last position
        out[:, t] = torch.where(done, c.pad_id, nxt)
        done |= nxt == eos
        if done.all():
            break
    return out
