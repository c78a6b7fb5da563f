"""The vision transformer from scratch (book chapter *Vision transformers*, eqs. eq-vit-patch,
eq-vit-pos, eq-vit): patches, the patch map W_p, the class token, learned positions R, L pre-norm
blocks, the final LayerNorm and the head W_head. ``tests/test_scratch_vit.py`` proves it equal to
``tc.vision.ViT`` (the package's default: non-overlapping patches, a class token, dropout)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def patches(images, P):
    """X_pix: images (B, C_in, H_px, W_px) cut into P x P patches, each flattened by vec in (C_in, P,
    P) order; the patches run left to right along the top row of the grid, then the next row down.
    (The package's patch_stride < P, overlapping patches, pads the image and uses F.unfold instead.)"""
    B, C, H_px, W_px = images.shape
    x = images.reshape(B, C, H_px // P, P, W_px // P, P)  # (B, C, grid rows, P, grid cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, grid rows, grid cols, C, P, P): the grid first
    return x.reshape(B, (H_px // P) * (W_px // P), C * P * P)  # (B, N, C P^2): row n is p_n


class Attention(nn.Module):
    """Multi-head self-attention: H heads of width d_k = D / H side by side, then W_o."""

    def __init__(self, D, H, p):
        super().__init__()
        self.H, self.d_k, self.p = H, D // H, p
        # nn.Linear stores W^T and computes X @ W + b; head h owns features h d_k : (h + 1) d_k
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, X):
        B, N, D = X.shape

        def split(T):  # (B, N, D) -> (B, N, H, d_k) -> (B, H, N, d_k)
            return T.reshape(B, N, self.H, self.d_k).transpose(1, 2)

        Q, K, V = split(self.W_q(X)), split(self.W_k(X)), split(self.W_v(X))  # (B, H, N, d_k)
        A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)  # (B, H, N, N)
        A = F.dropout(A, self.p, self.training)  # dropout on the attention weights
        Y = (A @ V).transpose(1, 2)  # (B, H, N, d_k) -> (B, N, H, d_k)
        return self.W_o(Y.reshape(B, N, D))  # the heads concatenated (B, N, D), then mixed by W_o


class Block(nn.Module):
    """A pre-norm block: Z = X + MHSA(LN(X)), Y = Z + MLP(LN(Z)); dropout on each branch's output."""

    def __init__(self, D, H, p):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(D), Attention(D, H, p), nn.LayerNorm(D)
        self.W_1, self.W_2, self.p = nn.Linear(D, 4 * D), nn.Linear(4 * D, D), p  # d_ff = 4D

    def forward(self, X):  # (B, N, D) -> (B, N, D)
        Z = X + F.dropout(self.attn(self.norm1(X)), self.p, self.training)
        mlp = self.W_2(F.gelu(self.W_1(self.norm2(Z))))  # phi = the exact GELU
        return Z + F.dropout(mlp, self.p, self.training)


class ViT(nn.Module):
    """logits z (B, |Y|) of images (B, C_in, H_px, W_px). The config needs image_size, patch_size,
    channels, n_classes, d_model, H, n_layers and dropout (the package's ViTConfig has them)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        D, P, N = c.d_model, c.patch_size, (c.image_size // c.patch_size) ** 2
        self.P, self.p = P, c.dropout
        self.W_p = nn.Linear(c.channels * P * P, D)  # the patch map W_p and its bias b_p
        self.x_cls = nn.Parameter(torch.zeros(1, 1, D))  # the class token x_cls
        self.R = nn.Parameter(0.02 * torch.randn(1 + N, D))  # a learned row per token, x_cls first
        self.blocks = nn.ModuleList(Block(D, c.H, c.dropout) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(D)  # the final LN: a pre-norm stream is never normalised otherwise
        self.W_head = nn.Linear(D, c.n_classes)  # W_head and b_head

    def forward(self, images):
        X = self.W_p(patches(images, self.P))  # (B, N, D): row n is W_p p_n + b_p
        X = torch.cat([self.x_cls.expand(len(X), -1, -1), X], dim=1)  # (B, 1 + N, D)
        X = F.dropout(X + self.R, self.p, self.training)  # X^(0), eq. (eq-vit)
        for block in self.blocks:
            X = block(X)  # X^(l) = block_l(X^(l-1))
        x_pool = self.norm(X)[:, 0]  # LN(X^(L)), the class token's row: (B, D)
        # pool="mean" (the package's other choice): no x_cls, R has N rows, x_pool = LN(X^(L)).mean(1)
        return self.W_head(x_pool)  # logits z: (B, |Y|)
