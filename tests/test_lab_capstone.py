"""Lab 7's capstone: the checkers of the GPT the learner writes (``language_models.*`` in
``exercises/language_models.py``) accept the reference solutions and learners' other correct answers,
and name each typical wrong model or answer by its ``why``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course.exercises import check, solution
from transformer_course.exercises import language_models as lm
from transformer_course.language_models import SHAKESPEARE_CPU, GPTConfig

CAPSTONE = [
    "language_models.embedding",
    "language_models.attention",
    "language_models.block",
    "language_models.gpt",
    "language_models.get_batch",
    "language_models.train_loop",
    "language_models.generate",
    "language_models.kv_cache",
    "language_models.gpt_cached",
    "language_models.generate_cached",
]
MISTAKES = [
    pytest.param(name, k, id=f"{name.split('.')[1]}-{k}")
    for name in CAPSTONE
    for k in range(len(tc.exercises._get(name).mistakes))
]


def test_the_capstone_exercises_are_registered_with_their_chapter():
    assert set(CAPSTONE) <= set(tc.exercises.list_exercises("language_models."))
    for name in CAPSTONE:
        ex = tc.exercises._get(name)
        assert isinstance(ex, lm.CapstoneExercise) and ex.solution.__module__ == lm.__name__


@pytest.mark.parametrize("name", CAPSTONE)
def test_the_reference_solution_passes(name):
    feedback = check(name, tc.exercises._get(name).solution)
    assert feedback.status == "correct", str(feedback)


@pytest.mark.parametrize("name", CAPSTONE)
def test_each_checker_knows_at_least_five_typical_mistakes(name):
    mistakes = tc.exercises._get(name).mistakes
    assert len(mistakes) >= 5
    assert len({m.why for m in mistakes}) == len(mistakes), "two mistakes with one explanation"


@pytest.mark.parametrize(("name", "k"), MISTAKES)
def test_each_typical_mistake_is_named(name, k):
    mistake = tc.exercises._get(name).mistakes[k]
    feedback = check(name, mistake.wrong)
    assert feedback.status == "incorrect", str(feedback)
    assert mistake.why in feedback.message, (mistake.why, feedback.message)


@pytest.mark.parametrize("name", ["language_models.gpt", "language_models.gpt_cached"])
def test_each_wrong_model_changes_the_logits_clearly_on_the_first_case(name):
    """A wrong model built from the same weights differs from the package's by far more than the
    tolerance, or fails (unless the checker tells it apart by its structure: names, shapes, tying)."""
    ex = tc.exercises._get(name)
    case = ex.cases()[0]
    expected = ex.expected(case)
    for mistake in ex.mistakes:
        try:
            wrong = lm._outcome(ex.observe, mistake.wrong, case)
        except lm._Verdict as verdict:
            assert mistake.why in str(verdict)
            continue
        if isinstance(wrong, Exception):  # e.g. positions beyond the context: an error to match
            assert isinstance(wrong, IndexError | ValueError | RuntimeError), (mistake.why, wrong)
            continue
        gap = max((wrong[k].double() - expected[k].double()).abs().max().item() for k in expected)
        assert gap > 1e3 * ex.atol, (mistake.why, gap)


# ----------------------------------------------------------------------------------------------
# The weights the checkers load, and the names they load them by


def test_the_lab_names_are_the_reference_models_names():
    package = tc.language_models.GPT(SHAKESPEARE_CPU)
    ours = lm.GPT(SHAKESPEARE_CPU)
    mapped = {lm.lab_name(n): tuple(p.shape) for n, p in package.state_dict().items()}
    assert mapped == {n: tuple(p.shape) for n, p in ours.state_dict().items()}
    assert lm.lab_name("stack.blocks.1.mlp.fc2.bias") == "blocks.1.mlp.2.bias"
    table = lm.parameter_table(SHAKESPEARE_CPU)
    assert "embed.pos_emb.weight" in table and "pos_emb.table.weight" in table
    assert "blocks.1." not in table  # block 0 stands for every block


def test_the_reference_model_with_the_package_weights_gives_the_package_logits():
    config = GPTConfig(vocab_size=11, block_size=9, n_layers=3, H=2, d_model=8, dropout=0.0)
    package = lm.package_gpt(config, seed=5)
    model = lm.GPT(config).double()
    model.load_state_dict(lm.lab_state_dict(package))
    idx = torch.randint(11, (3, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(idx)[0], package(idx)[0], atol=1e-12, rtol=0)


def test_the_checkers_weights_make_attention_far_from_uniform():
    """At GPT-2's N(0, 0.02) initialisation attention is nearly uniform and a missing scale would
    hardly show; the checkers' weights make it peaked."""
    config = lm._CONFIGS[0]
    block = lm.package_gpt(config).stack.blocks[0]
    X = torch.randn(2, 9, config.d_model, dtype=torch.float64)
    A = block.attn.attention_map(block.norm1(X))  # (B, H, N, N)
    uniform = 1.0 / torch.arange(1, 10, dtype=torch.float64)  # row n of a uniform causal map
    assert (A.amax(dim=-1) - uniform).max() > 0.3


def test_the_checkers_leave_the_random_state_and_the_threads_alone():
    threads = torch.get_num_threads()
    state = torch.random.get_rng_state()
    check("language_models.gpt", lm.GPT)
    check("language_models.train_loop", lm._wrong_loop(clip=False))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.get_num_threads() == threads


# ----------------------------------------------------------------------------------------------
# Answers a learner might write: other correct forms pass, errors are reported, never raised


class LearnerAttention(nn.Module):
    """Correct without a cache; with one, its causal mask is PyTorch's top-left aligned one."""

    def __init__(self, config):
        super().__init__()
        self.H = config.H
        self.in_proj = nn.Linear(config.d_model, 3 * config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self.register_buffer("unused", torch.tril(torch.ones(config.block_size, config.block_size)))

    def forward(self, X, cache=None):
        B, N, D = X.shape
        q, k, v = self.in_proj(X).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, N, self.H, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.permute(0, 2, 1, 3).reshape(B, N, D))


class LearnerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = LearnerAttention(config)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, X, cache=None):
        X = X + self.attn(self.norm1(X), cache)
        return X + self.mlp(self.norm2(X))


class LearnerEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)

    def forward(self, idx, start=0):
        return self.tok_emb(idx) + self.pos_emb.weight[start : start + idx.shape[1]]


class LearnerGPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = LearnerEmbedding(config)
        self.blocks = nn.ModuleList([LearnerBlock(config) for _ in range(config.n_layers)])
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.embed.tok_emb.weight = self.lm_head.weight  # tied the other way round: also tied

    def forward(self, idx, targets=None, caches=None):
        x = self.embed(idx, len(caches[0]) if caches else 0)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches else None)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_other_correct_models_pass_and_sdpa_is_causal_is_named_with_a_cache():
    assert check("language_models.embedding", LearnerEmbedding)
    assert check("language_models.attention", LearnerAttention)
    assert check("language_models.block", LearnerBlock)
    assert check("language_models.gpt", LearnerGPT)
    feedback = check("language_models.gpt_cached", LearnerGPT)
    assert lm.WHY_MASK_NOT_OFFSET in feedback.message and "is_causal" in feedback.message


def test_other_correct_functions_pass():
    def vectorised_batch(ids, block_size, batch_size, generator=None):
        ix = torch.randint(0, len(ids) - block_size, (batch_size,), generator=generator)
        windows = ids[ix[:, None] + torch.arange(block_size + 1)]
        return windows[:, :-1], windows[:, 1:]

    def loop_with_the_package_optimizer(model, next_batch, recipe, steps, seed=0):
        cfg = recipe.with_steps(steps).train
        opt, gen, losses = tc.train.make_optimizer(model, cfg), torch.Generator(), []
        gen.manual_seed(seed)
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = tc.train.lr_at(step, cfg)
            loss = model(*next_batch(gen))[1]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(loss.item())
        return losses

    def karpathy_generate(
        model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None
    ):
        for _ in range(max_new_tokens):
            logits = model(idx[:, -model.config.block_size :])[0][:, -1, :] / temperature
            if greedy:
                nxt = torch.argmax(logits, dim=-1, keepdim=True)
            else:
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx

    class PreallocatedCache(tc.language_models.KVCache):  # the package's, with a fixed capacity
        def __init__(self):
            super().__init__(64)

    assert check("language_models.get_batch", vectorised_batch)
    assert check("language_models.train_loop", loop_with_the_package_optimizer)
    assert check("language_models.generate", karpathy_generate)
    assert check("language_models.kv_cache", PreallocatedCache)


def test_cached_generation_equals_generation_without_a_cache():
    model = lm.package_gpt(lm._CONFIGS[0])
    idx = torch.randint(13, (3, 2), generator=torch.Generator().manual_seed(4))
    for kwargs in ({"greedy": True}, {"temperature": 0.7}):
        a = lm.generate(model, idx, 8, generator=torch.Generator().manual_seed(1), **kwargs)
        b = lm.generate_cached(model, idx, 8, generator=torch.Generator().manual_seed(1), **kwargs)
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="do not fit in the context"):
        lm.generate_cached(model, idx, 9)


def test_unattempted_and_broken_answers_are_reported_not_raised():
    class Skeleton(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError

    class HalfDone(lm.Block):
        def forward(self, X, cache=None):
            raise NotImplementedError

    class Broken(lm.Block):
        def forward(self, X, cache=None):
            return X @ torch.ones(3, 3, dtype=X.dtype)

    for name in CAPSTONE:
        assert check(name, None).status == "not attempted"
        assert "expects your" in check(name, "GPT").message
    assert check("language_models.gpt", Skeleton).status == "not attempted"
    assert check("language_models.block", HalfDone).status == "not attempted"
    feedback = check("language_models.block", Broken)
    assert feedback.status == "error" and "RuntimeError" in feedback.message
    assert "line" in feedback.message and "torch.ones(3, 3" in feedback.message


def test_parameters_with_other_names_or_shapes_are_named():
    class SeparateProjections(nn.Module):
        def __init__(self, config):
            super().__init__()
            D = config.d_model
            self.q, self.k, self.v, self.proj = (nn.Linear(D, D) for _ in range(4))

        def forward(self, X, cache=None):
            return X

    class Transposed(lm.CausalSelfAttention):
        def __init__(self, config):
            super().__init__(config)
            self.in_proj = nn.Linear(3 * config.d_model, config.d_model)

    class BiasedHead(lm.GPT):
        def __init__(self, config):
            super().__init__(config)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size)
            self.lm_head.weight = self.embed.tok_emb.weight

    message = check("language_models.attention", SeparateProjections).message
    assert "no parameter `in_proj.weight`" in message and "`q.weight`" in message
    message = check("language_models.attention", Transposed).message
    assert "`in_proj.weight` has shape (12, 36)" in message and lm.WHY_TRANSPOSED in message
    assert "`lm_head.bias`" in check("language_models.gpt", BiasedHead).message


def test_a_difference_no_single_mistake_explains_is_located():
    two_in_one_block = lm._variant(lm._Block, "_PostNormRelu", arrangement="post", relu=True)
    message = check("language_models.block", two_in_one_block).message
    assert "although its attention matches" in message
    no_mask = lm._variant(lm._Attention, "_NoMaskToo", mask="none")
    post_norm_without_mask = lm._variant(
        lm._GPT, "_PostNormNoMask", block=lm.BLOCK_ONLY_MISTAKES[0].wrong, attention=no_mask
    )
    message = check("language_models.gpt", post_norm_without_mask).message
    assert message.startswith("block 0: ") and lm.WHY_NO_MASK in message
    off_by_one_without_final_norm = lm._variant(
        lm._GPT, "_TwoSlips", embedding=lm._OffByOne, final_norm_used=False
    )
    assert (
        lm.WHY_POSITIONS_OFF_BY_ONE
        in check("language_models.gpt", off_by_one_without_final_norm).message
    )


def test_solutions_print_the_reference_classes(capsys):
    src = solution("language_models.gpt")
    assert src.startswith("class GPT(nn.Module):") and "self.lm_head.weight = " in src
    assert "_register" not in src and capsys.readouterr().out.strip() == src.strip()
    assert solution("language_models.get_batch").startswith("def get_batch(")


def test_the_training_checker_sees_every_setting_of_the_recipe():
    """The checker's recipe differs from AdamW's defaults and clips, so each setting matters."""
    cfg = lm._TRAIN_RECIPE.train
    assert cfg.betas != (0.9, 0.999) and cfg.weight_decay > 0 and cfg.warmup_steps < 6
    losses = lm._expected_train(lm._train_case()[0])["the training losses"]
    assert losses[-1] < losses[0] and math.isfinite(losses.sum())


def test_a_model_without_its_config_is_told_to_keep_it():
    class Forgetful(lm.GPT):
        def __init__(self, config):
            super().__init__(config)
            del self.config

    assert "self.config" in check("language_models.gpt", Forgetful).message
