"""Chapter *Autoregressive language models*: the GPT (loss at initialisation, causality, the
incremental property, masks, checkpoints), the key-value cache, generation, the recipe, the exercises."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import types

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.exercises import language_models as el
from transformer_course.language_models import (
    GPT,
    SHAKESPEARE_CPU_RECIPE,
    TINY,
    GPTConfig,
    KVCache,
    attention_maps,
    bigram_log_probs,
    bits_per_token,
    continuation_loss,
    fit_to_time,
    generate,
    generate_text,
    generate_with_logits,
    next_token,
    perplexity,
    positions_processed,
    replace_prefix_tokens,
    sample_under_teacher_forcing,
    seconds_per_step,
    teacher_forced_vs_free_running,
    train_char_lm,
    unigram_log_probs,
    window_start,
)
from transformer_course.notation import turner_attention
from transformer_course.scratch import gpt as scratch
from transformer_course.self_attention import attention_weights, causal_mask
from transformer_course.tokens import CharTokenizer

# ----------------------------------------------------------------------------------------------
# The model


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(TINY).eval()


def test_untrained_loss_is_log_vocab(model):
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 65, (2, 16, 32), generator=g)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(65)) < 0.05


def test_incremental_property(model):
    """Appending a token leaves the outputs at earlier positions unchanged (causality)."""
    idx = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        short = model(idx[:, :8])[0]
        long = model(idx)[0]
        changed = idx.clone()
        changed[:, 8:] = (changed[:, 8:] + 1) % 65
        other = model(changed)[0]
    torch.testing.assert_close(long[:, :8], short, atol=1e-5, rtol=0)
    torch.testing.assert_close(other[:, :8], long[:, :8], atol=1e-5, rtol=0)
    assert not torch.allclose(other[:, 8:], long[:, 8:])


def test_turner_and_mit_causal_masks_are_the_same_mask():
    """Turner: A[n', n] upper-triangular, columns normalised. MIT: -inf above the diagonal of row scores."""
    torch.manual_seed(3)
    N, D, K = 6, 5, 3
    X = torch.randn(N, D, dtype=torch.float64)
    W_q, W_k = torch.randn(D, K, dtype=torch.float64), torch.randn(D, K, dtype=torch.float64)
    # MIT: S + M with M[n, m] = -inf for m > n, softmax over each row
    S = (X @ W_q) @ (X @ W_k).T / math.sqrt(K)
    M = torch.zeros(N, N, dtype=torch.float64).masked_fill(~causal_mask(N), float("-inf"))
    A_mit = torch.softmax(S + M, dim=-1)
    # Turner: column n may use rows n' <= n, i.e. keep the upper triangle of A[n', n]
    A_cols = turner_attention(X.T, W_q.T, W_k.T)
    logits_cols = torch.log(A_cols)  # undo the softmax up to a per-column constant
    upper = torch.ones(N, N, dtype=torch.bool).triu()
    A_turner = torch.softmax(logits_cols.masked_fill(~upper, float("-inf")), dim=0)
    torch.testing.assert_close(A_turner.T, A_mit, atol=1e-12, rtol=0)
    assert torch.equal(upper.T, causal_mask(N))  # the same mask, transposed
    torch.testing.assert_close(attention_weights(X @ W_q, X @ W_k, causal_mask(N)), A_mit)


def test_errors_are_explained(model):
    with pytest.raises(ValueError, match="exceed the context of 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 65\)"):
        model(torch.full((1, 3), 70))
    with pytest.raises(ValueError, match=r"integer token ids of shape \(B, N\)"):
        model(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="divisible by H"):
        GPTConfig(d_model=10, H=3)


def test_tied_weights_and_parameter_count():
    m = GPT(TINY)
    assert m.lm_head.weight is m.tok_emb.weight
    D, V, L, N = TINY.d_model, TINY.vocab_size, TINY.n_layers, TINY.block_size
    per_block = 4 * D * D + 4 * D + 2 * 4 * D * D + 4 * D + D + 4 * D  # attention + MLP + 2 norms
    assert m.num_params() == V * D + N * D + L * per_block + 2 * D


def test_checkpoint_round_trip(model, tmp_path):
    path = tmp_path / "gpt.pt"
    model.save(path, chars="abc")
    loaded, extra = GPT.load(path)
    assert extra == {"chars": "abc"} and loaded.config == model.config
    idx = torch.randint(0, 65, (1, 10))
    torch.testing.assert_close(loaded.eval()(idx)[0], model(idx)[0])


# ----------------------------------------------------------------------------------------------
# The key-value cache and generation


def test_cache_writes_in_place_into_preallocated_buffers():
    cache = KVCache(capacity=5)
    K1, V1 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 6)
    K, V = cache.update(K1, V1)
    buffer = cache.K.data_ptr()
    assert cache.K.shape == (2, 3, 5, 4) and cache.V.shape == (2, 3, 5, 6) and len(cache) == 2
    K2, V2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 6)
    K, V = cache.update(K2, V2)
    assert cache.K.data_ptr() == buffer  # no new allocation, no concatenation
    assert torch.equal(K, torch.cat([K1, K2], dim=2)) and torch.equal(V, torch.cat([V1, V2], dim=2))
    assert K.data_ptr() == buffer  # a view of the buffer
    with pytest.raises(ValueError, match="at most 5 positions but 7"):
        cache.update(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 6))
    cache.reset()
    assert len(cache) == 0 and torch.equal(cache.update(K2, V2)[0], K2)
    with pytest.raises(ValueError, match="capacity"):
        KVCache(0)


def test_the_cache_lives_below_the_layers_that_take_it_and_every_public_name_resolves():
    """``kv_cache.py`` is shared infrastructure: ``multihead.py`` and ``block.py`` import the cache from
    it, never from this chapter's subpackage (one file per part), which re-exports every public name."""
    import pathlib

    assert KVCache is tc.kv_cache.KVCache is tc.language_models.KVCache
    assert "Autoregressive language models" in tc.kv_cache.__doc__
    src = pathlib.Path(tc.multihead.__file__).parent
    for module in ("multihead.py", "block.py", "kv_cache.py"):
        assert "language_models import" not in (src / module).read_text(), module
    for name in tc.language_models.__all__:
        assert getattr(tc.language_models, name).__module__.startswith("transformer_course."), name
    sizes = {
        p.name: len(p.read_text().splitlines()) for p in (src / "language_models").glob("*.py")
    }
    assert max(sizes.values()) < 600, sizes


def test_cached_step_equals_the_full_forward(model):
    idx = torch.randint(0, 65, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(idx)[0]
        caches = model.new_caches()
        first = model(idx[:, :12], caches=caches)[0]
        steps = [model(idx[:, n : n + 1], caches=caches)[0] for n in range(12, 20)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("prompt_len", [1, 5, 40])
def test_cached_equals_uncached_beyond_the_context(model, prompt_len):
    idx = torch.randint(0, 65, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    a, la = generate_with_logits(model, idx, 70, greedy=True, use_cache=True)
    b, lb = generate_with_logits(model, idx, 70, greedy=True, use_cache=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(la, lb, atol=1e-4, rtol=0)
    assert a.shape == (2, prompt_len + 70)


def test_sampling_with_the_same_seed_is_reproducible_and_cache_independent(model):
    idx = torch.zeros(1, 1, dtype=torch.long)
    runs = [
        generate(
            model,
            idx,
            40,
            temperature=0.8,
            top_k=5,
            use_cache=c,
            generator=torch.Generator().manual_seed(7),
        )
        for c in (True, False, True)
    ]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_window_policy():
    assert [window_start(T, 8) for T in (1, 8, 9, 12, 13, 16, 17)] == [0, 0, 4, 4, 8, 8, 12]
    for T in range(1, 60):
        assert 0 < T - window_start(T, 8) <= 8


def test_next_token_rules():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert next_token(logits, greedy=True).item() == 1
    g = torch.Generator().manual_seed(0)
    draws = {next_token(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {1, 3}  # only the two largest logits survive top-k
    with pytest.raises(ValueError, match="temperature must be > 0"):
        next_token(logits, temperature=0.0)


def test_prompts_with_unknown_characters_are_listed(model):
    tok = CharTokenizer.from_text("abcdefgh ")
    with pytest.raises(ValueError, match=r"'z', 'Q'"):
        generate_text(model, tok, "abz Q", 5)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_text(model, tok, "", 5)


@pytest.mark.parametrize(
    "prompt_len,new,use_cache", [(1, 150, True), (1, 150, False), (40, 70, True), (5, 1, False)]
)
def test_positions_processed_counts_what_generate_runs(prompt_len, new, use_cache):
    model = GPT(TINY).eval()  # context 32: the window jumps several times
    seen = []
    hook = model.tok_emb.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[1]))
    idx = torch.zeros(1, prompt_len, dtype=torch.long)
    generate(model, idx, new, greedy=True, use_cache=use_cache)
    hook.remove()
    assert sum(seen) == positions_processed(prompt_len, new, TINY.block_size, use_cache)
    assert len(seen) == new  # one call per new token: the last token is never fed back
    with pytest.raises(ValueError, match="prompt_len"):
        positions_processed(0, 3, 8, True)


def test_zero_new_tokens_returns_the_prompt_and_negative_is_an_error():
    model = GPT(TINY).eval()
    idx = torch.zeros(2, 3, dtype=torch.long)
    out, logits = generate_with_logits(model, idx, 0, greedy=True)
    assert torch.equal(out, idx) and logits.shape == (2, 0, TINY.vocab_size)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, idx, -1)


def test_generate_can_return_the_logits_it_chose_from(model):
    idx = torch.randint(0, 65, (2, 3), generator=torch.Generator().manual_seed(5))
    out = generate(model, idx, 12, greedy=True)
    out2, logits = generate(model, idx, 12, greedy=True, return_logits=True)
    assert isinstance(out, torch.Tensor) and torch.equal(out, out2)
    assert logits.shape == (2, 12, TINY.vocab_size)
    assert torch.equal(logits.argmax(-1), out[:, 3:])  # greedy: each token is its logits' arg-max
    out3, logits3 = generate_with_logits(model, idx, 12, greedy=True)
    assert torch.equal(out3, out) and torch.equal(logits3, logits)


# ----------------------------------------------------------------------------------------------
# Perplexity, bits per character and what the heads attend to


def test_perplexity_and_bits_per_token():
    p = torch.tensor([0.5, 0.25, 0.125, 0.8], dtype=torch.float64)  # probabilities of the targets
    nll = -p.log()
    geometric = math.prod((1 / p).tolist()) ** (1 / len(p))
    assert math.isclose(perplexity(nll), geometric, rel_tol=1e-12)
    assert math.isclose(
        bits_per_token(nll), -sum(math.log2(q) for q in p.tolist()) / 4, rel_tol=1e-12
    )
    uniform = torch.full((10,), math.log(65))
    assert math.isclose(perplexity(uniform), 65, rel_tol=1e-6)
    assert math.isclose(bits_per_token(uniform), math.log2(65), rel_tol=1e-6)
    assert perplexity(nll) < (1 / p).mean().item()  # not the arithmetic mean of 1/p
    for bad in (torch.tensor([]), torch.tensor([-0.1, 1.0]), torch.tensor([float("inf")])):
        with pytest.raises(ValueError, match="negative log-likelihood"):
            perplexity(bad)


def test_attention_maps_recompute_each_blocks_causal_weights(model):
    idx = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(6))
    maps = attention_maps(model, idx)
    assert len(maps) == TINY.n_layers and all(A.shape == (2, TINY.H, 10, 10) for A in maps)
    with torch.no_grad():  # block by block: LN, then the layer's weights, then the block itself
        X = model.pos_emb(model.tok_emb(idx))
        for A, block in zip(maps, model.stack.blocks, strict=True):
            Q, K, _ = block.attn.project(block.norm1(X))
            S = Q @ K.transpose(-2, -1) / math.sqrt(TINY.d_model // TINY.H)
            expected = torch.softmax(S.masked_fill(~causal_mask(10), float("-inf")), dim=-1)
            torch.testing.assert_close(A, expected, atol=1e-6, rtol=0)
            X = block(X)
    for A in maps:
        torch.testing.assert_close(A.sum(-1), torch.ones(2, TINY.H, 10))
        assert torch.equal(A.triu(1), torch.zeros_like(A))  # no weight on later tokens
    assert all(not blk.attn._forward_pre_hooks for blk in model.stack.blocks)  # hooks removed
    assert model.training is False and maps[0].grad_fn is None
    with pytest.raises(ValueError, match=r"shape \(B, N\)"):
        attention_maps(model, idx[0])


# ----------------------------------------------------------------------------------------------
# Baselines and the measurements of exposure bias


def test_unigram_and_bigram_models_match_counting_loops():
    ids = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(0))
    ids[ids == 4] = 3  # token 4 never occurs: smoothing must still give it probability
    V, seq = 5, ids.tolist()
    uni = unigram_log_probs(ids, V).exp()
    for w in range(V):
        assert math.isclose(uni[w].item(), (seq.count(w) + 1) / (len(seq) + V), rel_tol=1e-12)
    bi = bigram_log_probs(ids, V, alpha=0.5).exp()
    for v in range(V):
        follows = [b for a, b in itertools.pairwise(seq) if a == v]
        for w in range(V):
            expected = (follows.count(w) + 0.5) / (len(follows) + 0.5 * V)
            assert math.isclose(bi[v, w].item(), expected, rel_tol=1e-12)
    torch.testing.assert_close(bi.sum(dim=1), torch.ones(V, dtype=torch.float64))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        unigram_log_probs(ids, V, alpha=0.0)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        bigram_log_probs(ids, 3)


def test_teacher_forced_and_free_running_predictions_match_loops(model):
    windows = torch.randint(0, 65, (3, 12), generator=torch.Generator().manual_seed(5))
    n0 = 5
    forced, free = teacher_forced_vs_free_running(model, windows, n0)
    with torch.no_grad():
        for n in range(n0, 12):  # token n predicted from the true tokens before it
            assert torch.equal(forced[:, n - n0], model(windows[:, :n])[0][:, -1].argmax(-1))
        seq = windows[:, :n0]
        for _ in range(12 - n0):  # the model's own greedy continuation, one token at a time
            seq = torch.cat([seq, model(seq)[0][:, -1:].argmax(-1)], dim=1)
    assert torch.equal(free, seq[:, n0:])
    assert torch.equal(forced[:, 0], free[:, 0])  # the first prediction sees the same prefix
    with pytest.raises(ValueError, match="prompt_len"):
        teacher_forced_vs_free_running(model, windows, 12)
    with pytest.raises(ValueError, match="exceed the context"):
        teacher_forced_vs_free_running(model, torch.zeros(1, 40, dtype=torch.long), 5)


def test_samples_under_teacher_forcing_follow_the_model(model):
    x = torch.randint(0, 65, (1, 8), generator=torch.Generator().manual_seed(6)).expand(6000, -1)
    drawn = sample_under_teacher_forcing(model, x, torch.Generator().manual_seed(7))
    assert drawn.shape == x.shape and torch.equal(drawn[:, 0], x[:, 0])
    with torch.no_grad():
        p = torch.softmax(model(x[:1, :3])[0][0, -1], dim=-1)  # p(. | x[:, :3])
    freq = torch.bincount(drawn[:, 3], minlength=65).float() / len(drawn)
    assert (freq - p).abs().max() < 0.02


def test_replace_prefix_tokens_touches_only_the_prefix():
    g = torch.Generator().manual_seed(8)
    x, other = torch.zeros(50, 20, dtype=torch.long), torch.ones(50, 20, dtype=torch.long)
    assert torch.equal(replace_prefix_tokens(x, other, 0.0, 12, g), x)
    all_ = replace_prefix_tokens(x, other, 1.0, 12, g)
    assert (all_[:, :12] == 1).all() and (all_[:, 12:] == 0).all()
    some = replace_prefix_tokens(x, other, 0.3, 12, g)
    assert abs(some[:, :12].float().mean().item() - 0.3) < 0.05 and (some[:, 12:] == 0).all()
    with pytest.raises(ValueError, match="rho"):
        replace_prefix_tokens(x, other, 1.5, 12)


def test_continuation_loss_matches_one_pass_per_prefix(model):
    x = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(9))
    y = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(10))
    losses = continuation_loss(model, x, y, 6)
    assert losses.shape == (2, 5)
    with torch.no_grad():
        for j, n in enumerate(range(5, 10)):  # prediction at position n sees x[:, :n + 1]
            expected = F.cross_entropy(model(x[:, : n + 1])[0][:, -1], y[:, n], reduction="none")
            torch.testing.assert_close(losses[:, j], expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# The recipe


def test_the_recipe_trains_a_model_that_beats_the_uniform_guess():
    try:
        tc.data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    recipe = SHAKESPEARE_CPU_RECIPE.with_steps(30)
    run = train_char_lm(dataclasses.replace(recipe, eval_batches=2), steps=30)
    assert run.history.steps_done == 30 and run.model.config.vocab_size == 65
    assert run.val_loss < math.log(65) - 0.5, run.history.evals
    assert run.history.evals["val_loss"] == [run.val_loss]  # eval_interval 400: only at the end


def test_a_recipe_fitted_to_a_time_keeps_its_settings_and_its_whole_schedule_inside_it():
    """``seconds_per_step`` is the time of the steps a long run takes beyond a short one (a fake run
    of 2 s of set-up plus 50 ms a step: exactly 50 ms); ``fit_to_time`` then changes only the step
    count (90 % of what fits), the warm-up (at most a tenth of it), the evaluation (once, at the end)
    and the guard (one step short of the time), and refuses a time that holds fewer than ten steps."""

    def fake_run(recipe, device, steps, seed):  # train_char_lm's signature
        history = tc.train.History(seconds=2.0 + 0.05 * steps, steps_done=steps)
        return types.SimpleNamespace(history=history)

    recipe = SHAKESPEARE_CPU_RECIPE
    assert seconds_per_step(recipe, run=fake_run) == pytest.approx(0.05)
    fitted, step_seconds = fit_to_time(recipe, 30.0, run=fake_run)
    assert step_seconds == pytest.approx(0.05) and fitted.train.max_steps == 540  # 0.9 * 30 / 0.05
    assert fitted.train.warmup_steps == min(recipe.train.warmup_steps, 54) == 54
    assert fitted.train.eval_interval == 540 and fitted.train.time_budget_s == pytest.approx(29.95)
    changed = ("max_steps", "warmup_steps", "eval_interval", "time_budget_s")
    unchanged = dataclasses.replace(fitted.train, **{k: getattr(recipe.train, k) for k in changed})
    assert unchanged == recipe.train and dataclasses.replace(fitted, train=recipe.train) == recipe
    with pytest.raises(ValueError, match="only 9 steps"):
        fit_to_time(recipe, 0.5, run=fake_run)
    with pytest.raises(ValueError, match="at least 8 steps"):
        seconds_per_step(recipe, steps=7, run=fake_run)
    with pytest.raises(ValueError, match="margin"):
        fit_to_time(recipe, 30.0, run=fake_run, margin=1.5)


def test_seconds_per_step_times_the_real_training_loop():
    try:
        tc.data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    tiny = dataclasses.replace(SHAKESPEARE_CPU_RECIPE, model=TINY, batch_size=4)
    assert 0 < seconds_per_step(tiny) < 5  # 30 steps of TINY beyond 10: about 0.4 s


def test_the_chapters_model_is_the_cpu_model_at_half_the_width():
    """``SHAKESPEARE_CHAPTER_RECIPE``: the CPU recipe's blocks, heads and context at width 64, with
    its own schedule (900 steps of 32 windows; the recipe's docstring has the measurements), and the
    default of ``train_scratch_gpt``."""
    chapter, cpu = tc.language_models.SHAKESPEARE_CHAPTER_RECIPE, SHAKESPEARE_CPU_RECIPE
    assert chapter.model == dataclasses.replace(cpu.model, d_model=cpu.model.d_model // 2)
    assert chapter.model.d_model // chapter.model.H == 16  # heads of width 16
    assert (chapter.train.max_steps, chapter.batch_size) == (900, 32)
    assert chapter.train.eval_interval == chapter.train.max_steps  # one evaluation, at the end
    sig = inspect.signature(tc.language_models.train_scratch_gpt)
    assert sig.parameters["recipe"].default is chapter


def test_the_validation_loss_averages_fixed_batches_in_evaluation_mode():
    torch.manual_seed(0)
    model = scratch.GPT(TINY).train()
    recipe = dataclasses.replace(SHAKESPEARE_CPU_RECIPE, model=TINY, batch_size=4, eval_batches=3)
    ids = torch.randint(65, (500,), generator=torch.Generator().manual_seed(1))
    held_out = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        by_hand = [
            model.eval()(*tc.data.get_batch(ids, 32, 4, held_out))[1].item() for _ in range(3)
        ]
    model.train()
    assert tc.language_models.validation_loss(model, ids, recipe) == pytest.approx(
        sum(by_hand) / 3, abs=1e-12
    )
    assert model.training  # the mode is restored
    assert tc.language_models.validation_loss(
        model, ids, recipe
    ) == tc.language_models.validation_loss(model, ids, recipe)  # the same windows every time


def test_the_bigram_model_writes_from_its_table():
    """``generate_bigram`` draws each token from the row of the one before: a table with one certain
    successor per token gives the chain; a seeded draw repeats, and the frequencies follow a row."""
    V = 5
    successor = torch.tensor([2, 0, 4, 1, 3])
    certain = torch.full((V, V), -1e9).scatter(1, successor[:, None], 0.0)  # log p_2
    out = tc.language_models.generate_bigram(certain, torch.tensor([[0], [1]]), 6)
    expected = [[0]]
    for _ in range(6):
        expected[0].append(int(successor[expected[0][-1]]))
    assert out[0].tolist() == expected[0] and out.shape == (2, 7)
    log_p2 = torch.log_softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(0)), -1)
    start = torch.full((20_000, 1), 3)
    a = tc.language_models.generate_bigram(log_p2, start, 1, torch.Generator().manual_seed(4))
    b = tc.language_models.generate_bigram(log_p2, start, 1, torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    freq = torch.bincount(a[:, 1], minlength=V) / 20_000
    assert (freq - log_p2[3].exp()).abs().max() < 0.02


def test_side_by_side_prints_columns_of_wrapped_lines():
    text = tc.language_models.side_by_side({"left": "ab\ncd", "right": "x" * 12}, width=5)
    lines = text.splitlines()
    assert lines[0] == "left     right" and lines[1] == "-----    -----"
    assert lines[2:] == ["ab       xxxxx", "cd       xxxxx", "         xx"]


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "language_models.mit_causal_weights",
    "language_models.turner_causal_weights",
    "language_models.temperature_probs",
    "language_models.top_k_probs",
    "language_models.teacher_forcing_loss",
]


def test_all_exercises_are_registered():
    """The chapter's exercises; the capstone lab's (tests/test_lab_capstone.py) share the prefix."""
    registered = tc.exercises.list_exercises("language_models.")
    assert set(NAMES) <= set(registered) and registered == sorted(registered)


def test_causal_solutions_match_the_package_and_are_transposes():
    g = torch.Generator().manual_seed(0)
    N, d_k = 6, 3
    Q = torch.randn(N, d_k, generator=g, dtype=torch.float64)
    K = torch.randn(N, d_k, generator=g, dtype=torch.float64)
    S = Q @ K.T / math.sqrt(d_k)
    A = el.mit_causal_weights(S[None])[0]
    torch.testing.assert_close(A, attention_weights(Q, K, causal_mask(N)), atol=1e-12, rtol=0)
    A_cols = el.turner_causal_weights(S.T.contiguous())
    torch.testing.assert_close(A_cols, A.T, atol=1e-12, rtol=0)
    assert torch.equal(A_cols == 0, ~torch.ones(N, N, dtype=torch.bool).triu())


def test_large_negative_mask_is_accepted():
    """A finite mask value such as -1e9 is not a mistake: exp(-1e9) underflows to exactly 0."""

    def finite_mask(S):
        N = S.shape[-1]
        M = torch.zeros(N, N, dtype=S.dtype).masked_fill(~causal_mask(N), -1e9)
        return torch.softmax(S + M, dim=-1)

    assert tc.exercises.check("language_models.mit_causal_weights", finite_mask)


def test_filtering_probabilities_and_renormalising_is_accepted():
    def filter_probs(z, k):
        p = torch.softmax(z, dim=-1)
        kth = torch.topk(p, k, dim=-1).values[..., -1:]
        p = p * (p >= kth)
        return p / p.sum(dim=-1, keepdim=True)

    assert tc.exercises.check("language_models.top_k_probs", filter_probs)


def test_powered_probabilities_are_the_temperature_softmax():
    def powered(z, tau):
        p = torch.softmax(z, dim=-1) ** (1 / tau)
        return p / p.sum(dim=-1, keepdim=True)

    assert tc.exercises.check("language_models.temperature_probs", powered)


def test_sampling_solutions_match_next_token_frequencies():
    """The distributions the exercises ask for are the ones tc.language_models.next_token samples from."""
    z = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]], dtype=torch.float64)
    reps = 40_000
    for kwargs, p in (
        ({"temperature": 0.7}, el.temperature_probs(z, 0.7)),
        ({"temperature": 1.0, "top_k": 2}, el.top_k_probs(z, 2)),
    ):
        g = torch.Generator().manual_seed(0)
        draws = next_token(z.expand(reps, -1), generator=g, **kwargs)[:, 0]
        freq = torch.bincount(draws, minlength=z.shape[-1]).double() / reps
        torch.testing.assert_close(freq, p[0], atol=0.01, rtol=0)
    assert el.top_k_probs(z, 2)[0, 2:].eq(0).all()


def test_teacher_forcing_solution_equals_the_model_loss():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    tokens = torch.randint(0, TINY.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(el.teacher_forcing_loss(logits, tokens), loss)
