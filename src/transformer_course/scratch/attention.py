"""Self-attention from scratch: one head, then H heads side by side and W_o (chapters *Self-attention*
and *Multi-head self-attention*). Rows are tokens: X is (B, N, D). A mask is a bool (N, N) or
(B, N, N) matrix, True where query n may attend to key m; every row must keep at least one key."""

from __future__ import annotations

import math

import torch
from torch import nn


class Head(nn.Module):
    """One head: Y = softmax(Q K^T / sqrt(d_k)) V with Q = X W_q, K = X W_k, V = X W_v."""

    def __init__(self, D, d_k, bias=True):
        super().__init__()
        self.d_k = d_k
        self.W_q = nn.Linear(D, d_k, bias=bias)  # nn.Linear stores W_q^T, (d_k, D)
        self.W_k = nn.Linear(D, d_k, bias=bias)
        self.W_v = nn.Linear(D, d_k, bias=bias)  # d_v = d_k

    def forward(self, X, mask=None):
        Q, K, V = self.W_q(X), self.W_k(X), self.W_v(X)  # (B, N, d_k) each
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, N, N): query n, key m
        if mask is not None:
            S = S.masked_fill(~mask, float("-inf"))  # a hidden key gets weight exactly 0
        A = torch.softmax(S, dim=-1)  # (B, N, N): each row sums to one over the keys
        return A @ V  # (B, N, d_k): row n is an average of the values


class MultiHeadAttention(nn.Module):
    """H heads of width d_k = D / H in one pass; their outputs concatenated, then W_o."""

    def __init__(self, D, H, bias=True):
        super().__init__()
        self.H, self.d_k = H, D // H
        self.W_q = nn.Linear(D, D, bias=bias)  # the H query maps side by side
        self.W_k = nn.Linear(D, D, bias=bias)  # the H key maps
        self.W_v = nn.Linear(D, D, bias=bias)  # the H value maps
        self.W_o = nn.Linear(D, D, bias=bias)  # mixes the concatenated heads

    def forward(self, X, mask=None):
        B, N, D = X.shape
        # head h gets features h*d_k .. (h+1)*d_k - 1 of every token
        Q = self.W_q(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        K = self.W_k(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        V = self.W_v(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, N, N): one per head
        if mask is not None:  # (N, N) -> (1, N, N), (B, N, N) -> (B, 1, N, N): same for all heads
            S = S.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        A = torch.softmax(S, dim=-1)  # (B, H, N, N)
        heads = A @ V  # (B, H, N, d_k)
        concat = heads.transpose(1, 2).reshape(B, N, D)  # (B, N, H*d_k): [head_1, ..., head_H]
        return self.W_o(concat)  # (B, N, D)
