"""A GPT from scratch (book chapter *Autoregressive language models*): token and position embeddings,
causal multi-head self-attention, pre-norm blocks, a final LayerNorm and a head tied to the token table;
then the training step and loop (AdamW, warm-up and cosine decay, clipping) and generation with a
sliding window. ``tests/test_scratch_gpt.py`` loads the weights of ``tc.language_models.GPT`` into it
by name and proves the two equal in float64: logits, loss, training steps and generation."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    """Token plus position embedding: X[b, n] = E[idx[b, n]] + R[n]."""

    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)  # E: (V, D)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)  # R: (C, D)

    def forward(self, idx):
        N = idx.shape[1]
        positions = torch.arange(N, device=idx.device)  # 0, 1, ..., N - 1
        return self.tok_emb(idx) + self.pos_emb(positions)  # (B, N, D) + (N, D) -> (B, N, D)


class CausalSelfAttention(nn.Module):
    """H heads of width d_k = D / H side by side, each token attending to itself and the tokens
    before it: softmax(Q K^T / sqrt(d_k) + mask) V per head, then W_o."""

    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.H, self.d_k = config.H, D // config.H
        self.W_q = nn.Linear(D, D)  # the H query maps side by side (nn.Linear stores W^T, adds b)
        self.W_k = nn.Linear(D, D)  # the H key maps
        self.W_v = nn.Linear(D, D)  # the H value maps
        self.W_o = nn.Linear(D, D)  # mixes the concatenated heads
        self.drop = nn.Dropout(config.dropout)  # on the attention weights, while training

    def forward(self, X):
        B, N, D = X.shape
        # head h gets features h*d_k .. (h+1)*d_k - 1 of every token
        Q = self.W_q(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        K = self.W_k(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        V = self.W_v(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, N, N): query n, key m
        future = torch.triu(torch.ones(N, N, dtype=torch.bool, device=X.device), diagonal=1)
        S = S.masked_fill(future, float("-inf"))  # key m > query n: weight exactly 0
        A = torch.softmax(S, dim=-1)  # (B, H, N, N): each row sums to one over the keys
        A = self.drop(A)
        Y = A @ V  # (B, H, N, d_k)
        Y = Y.transpose(1, 2).reshape(B, N, D)  # (B, N, H, d_k) -> (B, N, D): heads side by side
        return self.W_o(Y)  # (B, N, D)


class Block(nn.Module):
    """Pre-norm block: Z = X + attn(LN1(X)), then Z + MLP(LN2(Z)); dropout on each branch."""

    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.norm1 = nn.LayerNorm(D)
        self.attn = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.drop = nn.Dropout(config.dropout)  # on each branch's output, before the sum

    def forward(self, X):
        Z = X + self.drop(self.attn(self.norm1(X)))  # (B, N, D): attention, with a residual
        return Z + self.drop(self.mlp(self.norm2(Z)))  # (B, N, D): the MLP, with a residual


class GPT(nn.Module):
    """A decoder-only transformer: embedding, L blocks, final LayerNorm, head tied to E."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.drop = nn.Dropout(config.dropout)  # on the embedded tokens
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # (V, D)
        self.lm_head.weight = self.embed.tok_emb.weight  # tied: W_vocab = E^T
        for name, p in self.named_parameters():  # nanoGPT's GPT-2-style initialisation
            if name.endswith(("W_o.weight", "mlp.2.weight")):  # the projections onto the residual
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layers))
            elif p.dim() == 2:  # the other weight matrices and the tables
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        """idx (B, N) token ids; targets (B, N) the next tokens, already shifted (the y of a batch:
        targets[b, n] follows idx[b, n], so they are not shifted again here), or None."""
        X = self.drop(self.embed(idx))  # (B, N, D)
        for block in self.blocks:
            X = block(X)  # (B, N, D)
        logits = self.lm_head(self.final_norm(X))  # (B, N, V)
        if targets is None:
            return logits, None
        B, N, V = logits.shape
        # one row per position: (B*N, V) logits, (B*N,) targets (targets[b, n] follows idx[b, n])
        loss = F.cross_entropy(logits.reshape(B * N, V), targets.reshape(B * N))  # the mean
        return logits, loss


def train_step(model, optimizer, x, y, grad_clip):
    """One step on the batch (x, y): loss, gradients, clipping, update. Returns the loss."""
    model.train()  # dropout on
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # global gradient norm <= grad_clip
    optimizer.step()
    return loss.item()


def train(model, next_batch, recipe, steps, seed=0):
    """Train `model` in place for `steps` steps with the settings `recipe.train` (lr, min_lr,
    warmup_steps, weight_decay, betas, grad_clip), batches from `next_batch(generator)`; returns
    the losses. The schedule is stretched over `steps`."""
    cfg = recipe.train
    matrices = [p for p in model.parameters() if p.dim() >= 2]  # weight decay on these only
    others = [p for p in model.parameters() if p.dim() < 2]  # biases, LayerNorm gains
    groups = [
        {"params": matrices, "weight_decay": cfg.weight_decay},
        {"params": others, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
    min_lr = cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr
    generator = torch.Generator().manual_seed(seed)  # draws the batches
    losses = []
    for step in range(steps):
        if step < cfg.warmup_steps:  # linear warm-up to lr
            lr = cfg.lr * (step + 1) / cfg.warmup_steps
        else:  # cosine decay from lr towards min_lr
            progress = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
            lr = min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = next_batch(generator)
        losses.append(train_step(model, optimizer, x, y, cfg.grad_clip))
    return losses


def generate(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
    """Extend idx (B, T) by max_new_tokens tokens, one at a time, the model seeing the last
    block_size tokens (a sliding window); returns (B, T + max_new_tokens)."""
    model.eval()  # no dropout
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -model.config.block_size :])  # (B, N, V)
            logits = logits[:, -1]  # (B, V): the last position predicts the next token
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)  # (B, T + 1)
    return idx
