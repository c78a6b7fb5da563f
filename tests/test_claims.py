"""Claims tested: every variant equals its definition, the statistics equal scipy's, every claim's
small setting runs and returns what it promises, and the exercises (the benchmark's quick mode is in
test_bench.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import claims as cl
from transformer_course import data
from transformer_course.exercises import _get
from transformer_course.multihead import SelfAttention
from transformer_course.self_attention import causal_mask, scaled_dot_product_attention_reference

matplotlib.use("Agg")
stats = pytest.importorskip("scipy.stats")  # scikit-learn's dependency; the package never uses it

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: one thread runs them as fast, and a busy second core cannot stall
    them (two threads waiting on each other on a shared 2-core machine can be several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def needs_corpus():
    try:
        data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")


# ----------------------------------------------------------------------------------------------
# Statistics against scipy


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 8, 13])
def test_student_t_cdf_and_quantile_equal_scipy(df):
    for t in (-7.5, -2.0, -0.3, 0.0, 0.4, 1.0, 2.776, 12.7):
        assert cl.student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-13)
    for p in (0.005, 0.05, 0.5, 0.9, 0.975, 0.995):
        assert cl.student_t_quantile(p, df) == pytest.approx(
            stats.t.ppf(p, df), rel=1e-9
        )  # old SciPy: ~2e-11


def test_t_helpers_reject_bad_arguments():
    with pytest.raises(ValueError, match="df must be an integer >= 1"):
        cl.student_t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="df must be an integer"):
        cl.student_t_cdf(1.0, 2.5)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        cl.student_t_quantile(1.0, 3)


@pytest.mark.parametrize("n", [2, 3, 5, 9])
def test_paired_t_interval_equals_scipy(n):
    g = torch.Generator().manual_seed(n)
    x = 2 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    y = x + 0.03 + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    mean, low, high = cl.paired_t_interval(x, y, 0.9)
    ci = stats.ttest_rel(y.numpy(), x.numpy()).confidence_interval(0.9)
    assert mean == pytest.approx(float((y - x).mean()), abs=1e-14)
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-10)  # old SciPy: ~3e-12


@pytest.mark.parametrize("n", [3, 5, 9])
def test_width_ratio_equals_scipys_two_intervals(n):
    g = torch.Generator().manual_seed(10 + n)
    for shared in (0.0, 0.1, 0.3):  # how much seed-to-seed variation the arms share
        common = shared * torch.randn(n, generator=g, dtype=torch.float64)
        x = 2 + common + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
        y = 2.05 + common + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
        w = lambda ci: ci.high - ci.low  # noqa: E731
        expected = w(stats.ttest_rel(y.numpy(), x.numpy()).confidence_interval()) / w(
            stats.ttest_ind(y.numpy(), x.numpy()).confidence_interval()
        )
        assert cl.width_ratio(x, y) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="neither sample varies"):
        cl.width_ratio([1.0, 1.0], [2.0, 2.0])
    with pytest.raises(ValueError, match="two or more pairs"):
        cl.width_ratio([1.0], [2.0])


def test_paired_t_interval_rejects_bad_samples():
    with pytest.raises(ValueError, match="at least 2 pairs"):
        cl.paired_t_interval([1.0], [2.0])
    with pytest.raises(ValueError, match="one baseline value per variant value"):
        cl.paired_t_interval([1.0, 2.0], [2.0])
    with pytest.raises(ValueError, match="drop diverged runs"):
        cl.paired_t_interval([1.0, float("nan")], [2.0, 1.0])


@pytest.mark.parametrize(
    "x,y", [([1, 2, 3, 4, 5], [2, 3, 4, 5, 6]), ([1, 2, 3, 4, 5, 6], [0, 3, 2, 5, 4, 7]),
            ([1, 1, 2, 5], [1, 2, 1, 4]), ([1, 2, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 0])],
)  # fmt: skip
def test_sign_test_equals_scipy_binomtest(x, y):
    d = [b - a for a, b in zip(x, y, strict=True)]
    n, k = sum(v != 0 for v in d), sum(v > 0 for v in d)
    assert cl.sign_test(x, y) == pytest.approx(stats.binomtest(k, n, 0.5).pvalue, abs=1e-14)


def test_sign_test_smallest_p_and_ties():
    assert cl.sign_test([0] * 5, [1] * 5) == 2**-4  # five seeds: 0.0625 at best
    assert cl.sign_test([1, 2], [1, 2]) == 1.0


# ----------------------------------------------------------------------------------------------
# Variants against their definitions


def _tied_and_separate(D=12, H=3, causal=True):
    torch.manual_seed(0)
    tied = cl.TiedQKSelfAttention(D, H, causal=causal).double()
    sep = SelfAttention(D, H, causal=causal).double()
    with torch.no_grad():
        W, b = tied.in_proj.weight, tied.in_proj.bias
        sep.in_proj.weight.copy_(torch.cat([W[:D], W[:D], W[D:]]))  # W_k := W_q
        sep.in_proj.bias.copy_(torch.cat([b[:D], b[:D], b[D:]]))
        sep.out_proj.load_state_dict(tied.out_proj.state_dict())
    return tied, sep


@pytest.mark.parametrize("causal", [False, True])
def test_tied_qk_equals_separate_maps_with_W_k_set_to_W_q(causal):
    tied, sep = _tied_and_separate(causal=causal)
    X = torch.randn(2, 7, 12, dtype=torch.float64)
    torch.testing.assert_close(tied(X), sep(X), atol=1e-12, rtol=0)
    torch.testing.assert_close(tied.attention_map(X), sep.attention_map(X), atol=1e-12, rtol=0)
    theirs = tied.to_torch()  # PyTorch's own module with W_k = W_q
    mask = ~causal_mask(7) if causal else None
    torch.testing.assert_close(tied(X), theirs(X, X, X, attn_mask=mask)[0], atol=1e-12, rtol=0)
    assert torch.equal(tied.weights["W_k"], tied.weights["W_q"])


def test_tied_qk_scores_are_symmetric_and_the_layer_is_smaller():
    tied, sep = _tied_and_separate(causal=False)
    X = torch.randn(1, 5, 12, dtype=torch.float64)
    Q, K, _ = tied.project(X)
    S = Q @ K.transpose(-2, -1)  # (B, H, N, N), eq. (eq-claims-tied)
    torch.testing.assert_close(S, S.transpose(-2, -1), atol=0, rtol=0)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(sep) - count(tied) == 12 * 12 + 12  # W_k and b_k
    with pytest.raises(TypeError, match="no W_k of its own"):
        tied.load_from_torch(nn.MultiheadAttention(12, 3))


def test_unscaled_attention_is_scale_one():
    torch.manual_seed(1)
    D, H = 16, 2
    un = cl.UnscaledSelfAttention(D, H, causal=True).double()
    X = torch.randn(3, 6, D, dtype=torch.float64)
    W = un.weights
    heads = []
    for h in range(H):  # eq. (eq-claims-unscaled), head by head, with scale 1
        cols = slice(h * 8, (h + 1) * 8)
        b = un.in_proj.bias.detach()
        Q = X @ W["W_q"][:, cols] + b[:D][cols]
        K = X @ W["W_k"][:, cols] + b[D : 2 * D][cols]
        V = X @ W["W_v"][:, cols] + b[2 * D :][cols]
        heads.append(scaled_dot_product_attention_reference(Q, K, V, causal_mask(6), scale=1.0))
    expected = un.out_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(un(X), expected, atol=1e-12, rtol=0)
    Q, K, _ = SelfAttention.project(un, X)  # the layer's own, unmultiplied queries and keys
    A = tc.attention_weights(Q, K, causal_mask(6), scale=1.0)
    torch.testing.assert_close(un.attention_map(X), A, atol=1e-12, rtol=0)
    # the scale can be absorbed into W_q (Turner's footnote 8): a scaled layer with sqrt(d_k) W_q
    scaled = SelfAttention(D, H, causal=True).double()
    scaled.load_state_dict(un.state_dict())
    with torch.no_grad():
        scaled.in_proj.weight[:D] *= math.sqrt(D // H)
        scaled.in_proj.bias[:D] *= math.sqrt(D // H)
    torch.testing.assert_close(un(X), scaled(X), atol=1e-12, rtol=0)


def test_token_batch_norm_is_batchnorm1d_over_batch_and_tokens():
    torch.manual_seed(2)
    B, N, D = 4, 5, 6
    ours = cl.TokenBatchNorm(D).double()
    theirs = nn.BatchNorm1d(D).double()  # (B, C, L) layout: channels are the features
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
        theirs.load_state_dict(ours.bn.state_dict())
    for _ in range(3):  # training mode, running averages updated alike
        X = 1 + 2 * torch.randn(B, N, D, dtype=torch.float64)
        Y = ours(X)
        torch.testing.assert_close(Y, theirs(X.transpose(1, 2)).transpose(1, 2), atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.bn.running_mean, theirs.running_mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.bn.running_var, theirs.running_var, atol=1e-12, rtol=0)
    mu, var = X.mean(dim=(0, 1)), X.var(dim=(0, 1), unbiased=False)  # eq. (eq-block-batchnorm)
    expected = ours.weight * (X - mu) / torch.sqrt(var + 1e-5) + ours.bias
    torch.testing.assert_close(Y, expected, atol=1e-12, rtol=0)
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(
        ours(X), theirs(X.transpose(1, 2)).transpose(1, 2), atol=1e-12, rtol=0
    )
    with pytest.raises(ValueError, match="tokens of width 5"):
        ours(torch.randn(2, 3, 5, dtype=torch.float64))


def _tiny(**changes):
    return dataclasses.replace(cl.SMALL.model, **changes)


def test_batchnorm_model_uses_batchnorm_everywhere_and_leaks_the_future_in_training_only():
    torch.manual_seed(3)
    model = cl.ClaimsLM(_tiny(), cl.BatchNormBlock).double()
    norms = [m for m in model.modules() if isinstance(m, (cl.TokenBatchNorm, tc.block.LayerNorm))]
    assert norms and all(isinstance(m, cl.TokenBatchNorm) for m in norms)
    assert isinstance(model.stack.final_norm, cl.TokenBatchNorm)
    idx = torch.randint(65, (4, 10))
    other = idx.clone()
    other[:, -1] = (other[:, -1] + 1) % 65  # change only the last token of every sequence
    with torch.no_grad():
        model.train()
        leak = (model(idx)[0][:, 0] - model(other)[0][:, 0]).abs().max()  # position 0's logits
        model.eval()
        none = (model(idx)[0][:, 0] - model(other)[0][:, 0]).abs().max()
    assert leak > 1e-8 and none == 0


def test_concatenation_then_a_linear_map_is_a_sum_of_two_maps():
    torch.manual_seed(4)
    d_tok, d_pos, N = 6, 2, 5
    pos = cl.ConcatenatedPositions(N, d_pos).double()
    X = torch.randn(3, N, d_tok, dtype=torch.float64)
    X0 = pos(X)  # (3, N, d_tok + d_pos)
    torch.testing.assert_close(X0[..., :d_tok], X, atol=0, rtol=0)
    R = pos.table.weight.detach()
    assert torch.equal(X0[1, :, d_tok:], R)
    lin = nn.Linear(d_tok + d_pos, 7, bias=False).double()  # eq. (eq-claims-concat)
    W_x, W_r = lin.weight[:, :d_tok], lin.weight[:, d_tok:]
    torch.testing.assert_close(lin(X0), X @ W_x.T + R @ W_r.T, atol=1e-12, rtol=0)
    model = cl.ClaimsLM(_tiny(), positions=cl.ConcatenatedPositions(32, 8))
    assert model.tok_emb.embedding_dim == 32 - 8


def test_position_layers():
    X = torch.randn(2, 9, 8, dtype=torch.float64)
    sin = cl.SinusoidalPositions(8)
    torch.testing.assert_close(sin(X), X + tc.position.sinusoidal_encoding(9, 8, dtype=X.dtype))
    assert cl.NoPositions()(X) is X
    clamp = cl.AddedPositions(4, 8, clamp=True).double()
    rows = clamp(torch.zeros(1, 9, 8, dtype=torch.float64))[0]
    assert torch.equal(rows[:4], clamp.table.weight.detach())
    assert all(torch.equal(rows[n], rows[3]) for n in range(4, 9))  # the last row, reused
    with pytest.raises(ValueError, match="use clamp=True"):
        cl.AddedPositions(4, 8)(X)


def test_claims_lm_is_causal_and_its_loss_is_the_cross_entropy():
    torch.manual_seed(5)
    model = cl.ClaimsLM(_tiny()).eval()
    idx = torch.randint(65, (2, 12))
    later = idx.clone()
    later[:, 8:] = (later[:, 8:] + 7) % 65
    logits, loss = model(idx, later)
    assert torch.equal(logits[:, :8], model(later)[0][:, :8])
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 65), later.reshape(-1)))
    assert model.tok_emb.weight.std().item() == pytest.approx(cl.EMBEDDING_STD, rel=0.1)
    with pytest.raises(ValueError, match="shape \\(B, N\\)"):
        model(idx[0])


def test_unit_variance_qk_gives_unit_variance_queries():
    torch.manual_seed(6)
    for block in (tc.block.PreNormBlock, cl.TiedQKBlock):
        model = cl.unit_variance_qk_(cl.ClaimsLM(_tiny(d_model=256, H=1), block))
        attn = model.stack.blocks[0].attn
        X = torch.nn.functional.layer_norm(torch.randn(1, 4000, 256), (256,))
        with torch.no_grad():
            Q, K, _ = attn.project(X)
        assert Q.var().item() == pytest.approx(1.0, abs=0.1)
        assert K.var().item() == pytest.approx(1.0, abs=0.1)


def test_xavier_linear_draws_glorot_uniform_weights_and_zero_biases():
    torch.manual_seed(9)
    model = cl.xavier_linear_(cl.ClaimsLM(_tiny(d_model=64)))
    fc1 = model.stack.blocks[0].mlp.fc1  # 64 -> 256
    bound = math.sqrt(6 / (64 + 256))
    assert fc1.weight.abs().max() <= bound and fc1.weight.abs().max() > 0.95 * bound
    assert fc1.weight.var().item() == pytest.approx(bound**2 / 3, rel=0.05)  # uniform's variance
    assert all(
        m.bias is None or (m.bias == 0).all() for m in model.modules() if isinstance(m, nn.Linear)
    )
    assert model.tok_emb.weight.std().item() == pytest.approx(
        cl.EMBEDDING_STD, rel=0.1
    )  # untouched


def test_normalised_entropy_against_scipy():
    g = torch.Generator().manual_seed(7)
    N = 6
    S = 2 * torch.randn(2, 3, N, N, generator=g, dtype=torch.float64)
    A = torch.softmax(S.masked_fill(~causal_mask(N), float("-inf")), dim=-1)
    got = cl.normalised_entropy(A)  # eq. (eq-claims-entropy)
    for b in range(2):
        for h in range(3):
            rows = [
                stats.entropy(A[b, h, n, : n + 1].numpy()) / math.log(n + 1) for n in range(1, N)
            ]
            assert got[b, h].item() == pytest.approx(sum(rows) / len(rows), abs=1e-12)
    uniform = causal_mask(N).double() / causal_mask(N).sum(-1, keepdim=True)
    assert cl.normalised_entropy(uniform).item() == pytest.approx(1.0, abs=1e-12)
    assert cl.normalised_entropy(torch.eye(N, dtype=torch.float64)).item() == 0.0
    with pytest.raises(ValueError, match="square causal weights"):
        cl.normalised_entropy(torch.ones(1, 3, 4))


def test_loss_by_position_and_attention_maps_and_gradient_norms():
    torch.manual_seed(8)
    model = cl.ClaimsLM(_tiny(n_layers=3))
    batches = [(torch.randint(65, (3, 10)), torch.randint(65, (3, 10))) for _ in range(2)]
    ell = cl.loss_by_position(model, batches)  # eq. (eq-claims-position-loss)
    with torch.no_grad():
        model.eval()
        loop = torch.stack([
            torch.stack([F.cross_entropy(model(x)[0][:, n], y[:, n]) for n in range(10)])
            for x, y in batches
        ]).mean(0)  # fmt: skip
    torch.testing.assert_close(ell, loop.double(), atol=1e-6, rtol=0)
    maps = cl.attention_maps(model, batches[0][0])
    with torch.no_grad():
        X = model.positions(model.tok_emb(batches[0][0]))
        blk = model.stack.blocks[0]
        torch.testing.assert_close(maps[0], blk.attn.attention_map(blk.norm1(X)))
    assert len(maps) == 3 and maps[2].shape == (3, 2, 10, 10)
    model.train()
    norms = cl.fc2_gradient_norms(model, *batches[0])
    model(*batches[0])[1].backward()
    assert norms == [b.mlp.fc2.weight.grad.norm().item() for b in model.stack.blocks]


# ----------------------------------------------------------------------------------------------
# The claims: small settings run and return what they promise


@pytest.mark.parametrize("name", list(cl.CLAIMS))
def test_every_claim_runs_and_reports_every_seed(name):
    needs_corpus()
    result = cl.CLAIMS[name](setting="small", seeds=(0, 1), steps=3)
    assert result.setting == "small" and result.runs and result.machine
    assert {r.seed for r in result.runs} == {0, 1}
    assert [r.variant for r in result.runs if r.seed == 0] == result.variants
    expected = {
        "tied_qk": ({"separate", "tied"}, "self_weight_final"),
        "batchnorm": ({"layernorm", "batchnorm", "layernorm/B4", "batchnorm/B4"},
                      "val_loss_batch_stats"),
        "concat": ({"added", "concatenated", "concatenated_wider", "added/gpt2-init",
                    "concatenated/gpt2-init"}, "val_loss"),
        "norm_position": ({f"{n}/L{L}/{w}" for n in ("pre", "post") for L in (2, 4)
                           for w in ("warmup", "no-warmup")}
                          | {"post/L4/xavier/warmup", "post/L4/xavier/no-warmup",
                             "pre/L4/xavier/no-warmup"}, "grad_norms_init"),
        "scale": ({"scaled", "unscaled"}, "entropy_init"),
        "length": ({"sinusoidal", "learned", "learned_clamp", "none"}, "loss_by_position"),
    }[name]  # fmt: skip
    assert set(result.variants) == expected[0]
    for r in result.runs:
        assert math.isfinite(r.val_loss) and r.params > 0
        assert r.get(expected[1]) is not None
    for v in result.variants[1:]:
        comp = result.compare(v)
        assert len(comp.diffs) == 2 and comp.low <= comp.mean <= comp.high
    again = cl.ClaimResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result
    assert result.table().count("\n") == len(result.variants)


def test_claim_figures_mean_what_they_say():
    needs_corpus()
    scale = cl.scaled_vs_unscaled(setting="small", seeds=(0,), steps=2)
    s, u = scale.runs
    assert u.extra["entropy_init"] < s.extra["entropy_init"]  # saturation without the scale
    assert u.extra["max_weight_init"] > s.extra["max_weight_init"]
    concat = cl.added_vs_concatenated(setting="small", seeds=(0,), steps=2)
    params = {r.variant: r.params for r in concat.runs}
    assert params["concatenated_wider"] > params["added"] > params["concatenated"]
    length = cl.length_generalisation(["sinusoidal"], setting="small", seeds=(0,), steps=2)
    ell = length.runs[0].extra["loss_by_position"]
    assert len(ell) == 4 * 32
    assert length.runs[0].extra["loss_beyond"] == pytest.approx(sum(ell[32:]) / 96, abs=1e-3)


def test_length_generalisation_takes_a_scheme_of_ones_own():
    needs_corpus()

    def halved_sinusoids(config):  # a callable scheme: any model built from the config
        return cl.ClaimsLM(config, positions=cl.SinusoidalPositions(config.d_model, base=100.0))

    r = cl.length_generalisation(
        {"base 100": halved_sinusoids, "none": "none"}, seeds=(0,), steps=2
    )
    assert r.variants == ["base 100", "none"] and r.baseline == "base 100"
    with pytest.raises(ValueError, match="unknown position scheme 'rope'"):
        cl.length_generalisation("rope", steps=1)
    with pytest.raises(ValueError, match="factor must be >= 2"):
        cl.length_generalisation("none", factor=1)


class _Explodes(nn.Module):
    """A model whose loss is NaN from its third training step on."""

    def __init__(self, config):
        super().__init__()
        self.inner, self.calls = cl.ClaimsLM(config), 0

    def forward(self, idx, targets=None):
        logits, loss = self.inner(idx, targets)
        if self.training:
            self.calls += 1
            if self.calls >= 3:
                loss = loss * float("nan")
        return logits, loss


def test_a_diverged_run_is_recorded_and_left_out_of_the_comparison():
    needs_corpus()
    variants = [cl.Variant("ok", lambda c: cl.ClaimsLM(c)), cl.Variant("bad", _Explodes)]
    r = cl.run_variants("test", variants, "small", seeds=(0, 1, 2), steps=4)
    bad = r.values("bad")
    assert bad == {0: None, 1: None, 2: None}
    assert all(run.diverged_at == 2 for run in r.runs if run.variant == "bad")
    assert "diverged" in r.table()
    with pytest.raises(ValueError, match="at least 2 pairs"):
        r.compare("bad")
    with pytest.raises(ValueError, match="variant names must differ"):
        cl.run_variants("test", variants[:1] * 2, "small", steps=1)
    with pytest.raises(ValueError, match="unknown setting 'huge'"):
        cl.run_variants("test", variants, "huge")


def test_schedule_keeps_the_warmup_share_or_drops_it():
    t = cl.recipes._schedule(cl.LARGE, None, warmup=True, seed=3)
    assert (t.max_steps, t.warmup_steps, t.eval_interval, t.seed) == (400, 40, 400, 3)
    assert cl.recipes._schedule(cl.LARGE, 100, warmup=True, seed=0).warmup_steps == 10
    assert cl.recipes._schedule(cl.LARGE, 100, warmup=False, seed=0).warmup_steps == 0
    assert (
        tc.train.lr_at(0, cl.recipes._schedule(cl.LARGE, None, warmup=False, seed=0))
        == cl.LARGE.train.lr
    )
    with pytest.raises(ValueError, match="steps must be >= 1"):
        cl.recipes._schedule(cl.LARGE, 0, warmup=True, seed=0)


def test_recorded_results_are_read_and_a_claim_file_wins(tmp_path):
    folder = tmp_path / "bench" / "results" / "cpu"
    assert cl.load_recorded(tmp_path) == {}
    run = cl.Run("a", 0, 1.5)
    make = lambda loss: cl.ClaimResult("x", "large", "val_loss", "a", ["a"],  # noqa: E731
                                       [dataclasses.replace(run, val_loss=loss)])  # fmt: skip
    (folder / "claims").mkdir(parents=True)
    whole = {"claims": {"x": make(1.5).to_json()}, "commit": "abc1234", "date": "2026-01-02"}
    (folder / "claims.json").write_text(json.dumps(whole))
    got = cl.load_recorded(tmp_path)["x"]
    assert got.runs[0].val_loss == 1.5 and (got.commit, got.date) == ("abc1234", "2026-01-02")
    (folder / "claims" / "x.json").write_text(json.dumps({"claims": {"x": make(1.2).to_json()}}))
    assert cl.load_recorded(tmp_path)["x"].runs[0].val_loss == 1.2


def _at(lr, losses):  # one claim's result at rate lr: {variant: [loss per seed]}
    runs = [cl.Run(v, s, x) for v, xs in losses.items() for s, x in enumerate(xs)]
    recipe = {"train": {"lr": lr}}
    return cl.ClaimResult("x", "large", "val_loss", "a", list(losses), runs, recipe=recipe)


def test_at_rate_changes_only_the_learning_rate_and_names_the_setting():
    r = cl.at_rate("large", 4e-3)
    assert r.train.lr == 4e-3 and r.model == cl.LARGE.model and r.seeds == cl.LARGE.seeds
    assert dataclasses.replace(r.train, lr=cl.LARGE.train.lr) == cl.LARGE.train
    assert cl.recipes._setting_name(r) == "large, lr 0.004"
    assert cl.recipes._setting_name(cl.LARGE) == "large"
    with pytest.raises(ValueError, match="positive"):
        cl.at_rate("large", 0.0)
    assert 8e-3 in cl.LR_GRID and cl.LR_GRID == tuple(sorted(cl.LR_GRID))


def test_each_arm_is_compared_at_its_own_best_rate():
    grid = {
        4e-3: _at(4e-3, {"a": [2.0, 2.1, 2.2], "b": [1.9, 2.0, 2.0]}),
        8e-3: _at(8e-3, {"a": [1.8, 1.9, 2.0], "b": [2.1, 2.2, 2.3]}),
        1.6e-2: _at(1.6e-2, {"a": [1.7, None, 1.6], "b": [2.5, 2.6, 2.7]}),  # a diverged at 1.6e-2
    }
    assert cl.best_rates(grid, select="val_loss") == {
        "a": 8e-3,
        "b": 4e-3,
    }  # a's best mean is at 1.6e-2, but a seed diverged
    c = cl.at_best_rates(grid, "b", "a", select="val_loss")
    assert c.diffs == pytest.approx((1.9 - 1.8, 2.0 - 1.9, 2.0 - 2.0))
    assert (c.variant, c.baseline) == ("b", "a")
    same_rate = grid[8e-3].compare("b", "a")  # what a single rate would have said: b worse
    assert same_rate.mean == pytest.approx(0.3) and c.mean == pytest.approx(0.2 / 3)
    with pytest.raises(KeyError, match="not recorded at every rate"):
        cl.at_best_rates(grid, "c", "a", select="val_loss")
    with pytest.raises(ValueError, match="empty"):
        cl.best_rates({})


def test_leave_one_seed_out_chooses_each_seeds_rate_without_its_own_runs():
    """Seed 0 of "b" is lucky at 4e-3: chosen on all seeds, 4e-3 wins and seed 0 is compared at its
    lucky figure; chosen without seed 0, 8e-3 wins for it, while seeds 1 and 2 keep 4e-3."""
    grid = {
        4e-3: _at(4e-3, {"a": [2.0, 2.0, 2.0], "b": [1.0, 2.0, 2.0]}),
        8e-3: _at(8e-3, {"a": [2.1, 2.1, 2.1], "b": [1.8, 1.8, 1.8]}),
    }
    assert cl.best_rates(grid, "val_loss") == {"a": 4e-3, "b": 4e-3}
    assert cl.best_rates(grid, "val_loss", leave_out=0) == {"a": 4e-3, "b": 8e-3}
    assert cl.best_rates(grid, "val_loss", leave_out=1) == {"a": 4e-3, "b": 4e-3}
    every = cl.at_best_rates(grid, "b", "a", select="val_loss")
    loso = cl.at_best_rates(grid, "b", "a", select="val_loss", leave_one_out=True)
    assert every.diffs == pytest.approx((-1.0, 0.0, 0.0))
    assert loso.diffs == pytest.approx((1.8 - 2.0, 0.0, 0.0))
    assert loso.seeds == every.seeds == (0, 1, 2)


def test_rates_are_chosen_on_another_figure_than_the_one_compared():
    """By default an arm's rate is chosen on the training loss of its last stretch (or, for the
    length claim, on the loss inside the training length), never on the compared figure: here the
    held-out loss would pick 4e-3 for "b" by the luck of its runs, the training loss picks 8e-3."""

    def at(lr, held_out, trained, metric="val_loss", extra_key=None):
        runs = [cl.Run("b", s, x, curve=[3.0, t], extra={extra_key: t} if extra_key else {})
                for s, (x, t) in enumerate(zip(held_out, trained, strict=True))]  # fmt: skip
        return cl.ClaimResult("x", "large", metric, "b", ["b"], runs, recipe={"train": {"lr": lr}})

    grid = {4e-3: at(4e-3, [2.0, 2.0], [2.3, 2.3]), 8e-3: at(8e-3, [2.1, 2.1], [2.2, 2.2])}
    assert grid[4e-3].selection == "train_loss_final"
    assert grid[4e-3].runs[0].get("train_loss_final") == 2.3  # the curve's last stretch
    assert cl.best_rates(grid) == {"b": 8e-3}
    assert cl.best_rates(grid, select="val_loss") == {"b": 4e-3}
    length = {lr: at(lr, [3.0 - lr, 3.0 - lr], [2.0 + lr, 2.0 + lr], "loss_beyond", "loss_in_range")
              for lr in (4e-3, 8e-3)}  # fmt: skip
    for r in length.values():  # the figure beyond the length is loss_beyond, an extra figure
        for run in r.runs:
            run.extra["loss_beyond"] = run.val_loss
    assert length[4e-3].selection == "loss_in_range"
    assert cl.best_rates(length) == {"b": 4e-3}  # lowest loss inside the length
    assert cl.best_rates(length, select="loss_beyond") == {"b": 8e-3}
    diverged = cl.Run("b", 0, None, diverged_at=3, curve=[3.0, 2.0])
    assert diverged.get("train_loss_final") is None


def test_the_learning_rate_grid_is_read_from_the_recorded_files(tmp_path):
    folder = tmp_path / "bench" / "results" / "cpu"
    (folder / "claims-lr").mkdir(parents=True)
    (folder / "claims.json").write_text(
        json.dumps({"claims": {"x": _at(8e-3, {"a": [2.0]}).to_json()}})
    )
    for lr in (4e-3, 8e-3):  # a grid file at the recipe's rate wins over claims.json
        data = {"claims": {"x": _at(lr, {"a": [1.0 + lr]}).to_json()}, "commit": "c", "date": "d"}
        (folder / "claims-lr" / f"lr{lr:g}.json").write_text(json.dumps(data))
    grid = cl.load_lr_grid(tmp_path)["x"]
    assert sorted(grid) == [4e-3, 8e-3]
    assert grid[8e-3].runs[0].val_loss == 1.0 + 8e-3 and grid[4e-3].commit == "c"


def test_plot_seeds_draws_every_seed():
    r = cl.ClaimResult(
        "x", "small", "val_loss", "a", ["a", "b"],
        [cl.Run("a", 0, 2.0), cl.Run("b", 0, 1.9), cl.Run("a", 1, 2.1), cl.Run("b", 1, None, 5)],
    )  # fmt: skip
    ax = cl.plot_seeds(r)
    assert len(ax.collections) >= 3  # the dots of each variant and the diverged run's cross
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]


# ----------------------------------------------------------------------------------------------
# Exercises


def test_exercise_solutions_equal_the_package():
    g = torch.Generator().manual_seed(0)
    x, y, t = _get("claims.paired_t_interval").make_inputs(g, 0)
    got = _get("claims.paired_t_interval").solution(x, y, t)
    torch.testing.assert_close(got, torch.tensor(cl.paired_t_interval(x, y), dtype=torch.float64))
    (A,) = _get("claims.normalised_entropy").make_inputs(g, 0)
    torch.testing.assert_close(
        _get("claims.normalised_entropy").solution(A), cl.normalised_entropy(A)
    )
    X, gamma, beta, eps = _get("claims.token_batch_norm").make_inputs(g, 0)
    bn = cl.TokenBatchNorm(X.shape[-1], eps=eps).double()
    with torch.no_grad():
        bn.weight.copy_(gamma)
        bn.bias.copy_(beta)
    torch.testing.assert_close(_get("claims.token_batch_norm").solution(X, gamma, beta, eps), bn(X))
    X, W = _get("claims.tied_qk_weights").make_inputs(g, 0)
    d_k, D = W.shape[1], X.shape[-1]
    layer = cl.TiedQKSelfAttention(D, 1, causal=True, bias=False).double()  # one head of width D
    with torch.no_grad():  # its W_q: W in the first d_k columns, scaled so that / sqrt(D) is
        layer.in_proj.weight[:D] = 0.0  # / sqrt(d_k); the other columns are zero
        layer.in_proj.weight[:d_k] = (D / d_k) ** 0.25 * W.T
    torch.testing.assert_close(
        _get("claims.tied_qk_weights").solution(X, W), layer.attention_map(X)[:, 0]
    )
