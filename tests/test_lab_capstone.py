"""Lab 7's capstone: the checkers of the GPT the learner writes (``language_models.*``, in the
subpackage ``exercises/language_models/``, one file per part) accept the reference solutions, which are
``scratch/gpt.py``'s classes and functions, and learners' other correct answers, and name each typical
wrong model or answer by its ``why``; the mistakes a learner who did the whole lab met are planted here
one by one, each with the message it must get."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course.exercises import check, solution
from transformer_course.exercises import language_models as lm
from transformer_course.exercises.language_models import (
    attention,
    block,
    checking,
    embedding,
    generation,
    gpt,
    kv_cache,
    training,
    warmups,
)
from transformer_course.language_models import SHAKESPEARE_CPU, GPTConfig
from transformer_course.scratch import gpt as scratch

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
C0, C1 = checking._CONFIGS


def test_the_capstone_exercises_are_registered_by_their_parts():
    assert set(CAPSTONE) <= set(tc.exercises.list_exercises("language_models."))
    for name in CAPSTONE:
        ex = tc.exercises._get(name)
        assert isinstance(ex, checking.CapstoneExercise)
        assert ex.registered_by.startswith(f"{lm.__name__}."), name


def test_the_reference_solutions_are_the_scratch_model_imported_not_copied():
    expected = {
        "language_models.embedding": scratch.Embedding,
        "language_models.attention": scratch.CausalSelfAttention,
        "language_models.block": scratch.Block,
        "language_models.gpt": scratch.GPT,
        "language_models.train_loop": scratch.train,
        "language_models.generate": scratch.generate,
    }
    for name, obj in expected.items():
        assert tc.exercises._get(name).solution is obj, name
    assert lm.GPT is scratch.GPT and lm.train_loop is scratch.train
    # part 5's reference is the package's own batching, the one the chapter trains with
    assert tc.exercises._get("language_models.get_batch").solution is tc.data.get_batch
    assert lm.get_batch is tc.data.get_batch
    # part 9's references subclass the scratch classes: each defines a new forward, nothing else
    for cls, base in [
        (lm.CachedAttention, scratch.CausalSelfAttention),
        (lm.CachedBlock, scratch.Block),
        (lm.CachedGPT, scratch.GPT),
    ]:
        assert cls.__bases__ == (base,) and "forward" in vars(cls), cls
    assert not {"W_q", "W_k"} & set(vars(lm.CachedAttention))


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
    tolerance, or fails, or gives NaN (unless the checker tells it apart by its structure: names,
    shapes, tying)."""
    ex = tc.exercises._get(name)
    case = ex.cases()[0]
    expected = ex.expected(case)
    for mistake in ex.mistakes:
        try:
            wrong = checking._outcome(ex.observe, mistake.wrong, case)
        except checking._Verdict as verdict:
            assert mistake.why in str(verdict)
            continue
        if isinstance(wrong, Exception):  # e.g. positions beyond the context: an error to match
            assert isinstance(wrong, IndexError | ValueError | RuntimeError), (mistake.why, wrong)
            assert mistake.fails_by == "raises", mistake.why
            continue
        if not all(torch.isfinite(w).all() for w in wrong.values()):
            assert mistake.fails_by == "nan", mistake.why
            continue
        gap = max((wrong[k].double() - expected[k].double()).abs().max().item() for k in expected)
        assert gap > 1e3 * ex.atol, (mistake.why, gap)


# ----------------------------------------------------------------------------------------------
# The weights the checkers load, and the names they load them by


def test_the_lab_names_are_the_scratch_models_names_with_in_proj_split():
    package = tc.language_models.GPT(SHAKESPEARE_CPU)
    ours = scratch.GPT(SHAKESPEARE_CPU)
    state = lm.lab_state_dict(package)
    assert {n: tuple(t.shape) for n, t in state.items()} == {
        n: tuple(t.shape) for n, t in ours.state_dict().items()
    }
    assert lm.lab_names("stack.blocks.1.mlp.fc2.bias") == ("blocks.1.mlp.2.bias",)
    assert lm.lab_names("stack.blocks.0.attn.out_proj.weight") == ("blocks.0.attn.W_o.weight",)
    q, k, v = lm.lab_names("stack.blocks.0.attn.in_proj.weight")
    assert (q, k, v) == tuple(f"blocks.0.attn.{w}.weight" for w in ("W_q", "W_k", "W_v"))
    D = SHAKESPEARE_CPU.d_model
    fused = package.state_dict()["stack.blocks.0.attn.in_proj.weight"]
    assert torch.equal(state[k], fused[D : 2 * D])  # W_k: the second block of rows
    table = lm.parameter_table(SHAKESPEARE_CPU)
    assert "embed.pos_emb.weight" in table and "pos_emb.table.weight" in table
    assert f"blocks.0.attn.W_v.weight  ({D}, {D})" in table
    assert f"stack.blocks.0.attn.in_proj.weight[{2 * D}:{3 * D}]" in table
    assert "blocks.1." not in table  # block 0 stands for every block


def test_the_lab_names_are_the_packages_one_map():
    assert lm.lab_names("stack.blocks.2.attn.in_proj.bias") == tc.language_models.scratch_names(
        "stack.blocks.2.attn.in_proj.bias"
    )
    package = lm.package_gpt(C0)
    ours, theirs = lm.lab_state_dict(package), tc.language_models.scratch_state_dict(package)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_reference_model_with_the_package_weights_gives_the_package_logits():
    config = GPTConfig(vocab_size=11, block_size=9, n_layers=3, H=2, d_model=8, dropout=0.0)
    package = lm.package_gpt(config, seed=5)
    model = lm.GPT(config).double().eval()
    model.load_state_dict(lm.lab_state_dict(package))
    idx = torch.randint(11, (3, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(idx)[0], package(idx)[0], atol=1e-12, rtol=0)


def test_the_checkers_weights_make_attention_far_from_uniform():
    """At the GPT-2-style N(0, 0.02^2) initialisation attention is nearly uniform and a missing scale would
    hardly show; the checkers' weights make it peaked."""
    block_ = lm.package_gpt(C0).stack.blocks[0]
    X = torch.randn(2, 9, C0.d_model, dtype=torch.float64)
    A = block_.attn.attention_map(block_.norm1(X))  # (B, H, N, N)
    uniform = 1.0 / torch.arange(1, 10, dtype=torch.float64)  # row n of a uniform causal map
    assert (A.amax(dim=-1) - uniform).max() > 0.3


def test_the_checkers_leave_the_random_state_and_the_threads_alone():
    threads = torch.get_num_threads()
    state = torch.random.get_rng_state()
    check("language_models.gpt", lm.GPT)
    check("language_models.train_loop", training._wrong_loop(clip=False))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.get_num_threads() == threads


# ----------------------------------------------------------------------------------------------
# Answers a learner might write: other correct forms pass, errors are reported, never raised


class LearnerAttention(nn.Module):
    """Correct, with PyTorch's fused attention and a mask buffer it does not need."""

    def __init__(self, config):
        super().__init__()
        self.H = config.H
        D = config.d_model
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))
        self.register_buffer("unused", torch.tril(torch.ones(config.block_size, config.block_size)))

    def forward(self, X):
        B, N, D = X.shape
        q, k, v = (
            W(X).reshape(B, N, self.H, -1).permute(0, 2, 1, 3)
            for W in (self.W_q, self.W_k, self.W_v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.W_o(y.permute(0, 2, 1, 3).reshape(B, N, D))


class LearnerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = LearnerAttention(config)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, X):
        X = X + self.attn(self.norm1(X))
        return X + self.mlp(self.norm2(X))


class LearnerEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)

    def forward(self, idx):
        return self.tok_emb(idx) + self.pos_emb.weight[: idx.shape[1]]


class LearnerGPT(nn.Module):
    """Correct, tied the other way round, initialised as nanoGPT does (apply, then the projections)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = LearnerEmbedding(config)
        self.blocks = nn.ModuleList([LearnerBlock(config) for _ in range(config.n_layers)])
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.embed.tok_emb.weight = self.lm_head.weight  # tied the other way round: also tied
        self.apply(tc.language_models.gpt2_init)
        for name, p in self.named_parameters():
            if name.endswith(("W_o.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layers))

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block_ in self.blocks:
            x = block_(x)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LearnerCachedAttention(LearnerAttention):
    """With a cache, its causal mask is PyTorch's top-left aligned one."""

    def forward(self, X, cache=None):
        B, N, D = X.shape
        q, k, v = (
            W(X).reshape(B, N, self.H, -1).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v)
        )
        if cache is not None:
            k, v = cache.update(k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.W_o(y.transpose(1, 2).reshape(B, N, D))


class LearnerCachedBlock(LearnerBlock):
    def __init__(self, config):
        super().__init__(config)
        self.attn = LearnerCachedAttention(config)

    def forward(self, X, cache=None):
        X = X + self.attn(self.norm1(X), cache)
        return X + self.mlp(self.norm2(X))


class LearnerCachedGPT(LearnerGPT):
    def __init__(self, config):
        super().__init__(config)
        self.blocks = nn.ModuleList([LearnerCachedBlock(config) for _ in range(config.n_layers)])

    def forward(self, idx, targets=None, caches=None):
        start = len(caches[0]) if caches else 0
        x = self.embed.tok_emb(idx) + self.embed.pos_emb.weight[start : start + idx.shape[1]]
        for i, block_ in enumerate(self.blocks):
            x = block_(x, caches[i] if caches else None)
        return self.lm_head(self.final_norm(x)), None


def test_other_correct_models_pass_and_sdpa_is_causal_is_named_with_a_cache():
    assert check("language_models.embedding", LearnerEmbedding)
    assert check("language_models.attention", LearnerAttention)
    assert check("language_models.block", LearnerBlock)
    assert check("language_models.gpt", LearnerGPT)
    feedback = check("language_models.gpt_cached", LearnerCachedGPT)
    assert kv_cache.WHY_MASK_NOT_OFFSET in feedback.message and "is_causal" in feedback.message


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
    model = lm.CachedGPT(C0).double()
    model.load_state_dict(lm.lab_state_dict(lm.package_gpt(C0)))
    idx = torch.randint(13, (3, 2), generator=torch.Generator().manual_seed(4))
    for kwargs in ({"greedy": True}, {"temperature": 0.7}):
        a = lm.generate(model, idx, 8, generator=torch.Generator().manual_seed(1), **kwargs)
        b = lm.generate_cached(model, idx, 8, generator=torch.Generator().manual_seed(1), **kwargs)
        assert torch.equal(a, b)
    lm.generate_cached(model, idx, 9)  # 2 + 9 - 1 = C: the last token is never fed, so it fits
    with pytest.raises(ValueError, match="do not fit in the context"):
        lm.generate_cached(model, idx, 10)


def test_unattempted_and_broken_answers_are_reported_not_raised():
    class Skeleton(nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError

    class HalfDone(lm.Block):
        def forward(self, X):
            raise NotImplementedError

    class Broken(lm.Block):
        def forward(self, X):
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
    class FusedProjection(nn.Module):  # the package's names, not the lab's
        def __init__(self, config):
            super().__init__()
            D = config.d_model
            self.in_proj, self.out_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

        def forward(self, X):
            return X

    class Transposed(lm.CausalSelfAttention):
        def __init__(self, config):
            super().__init__(config)
            self.W_q = nn.Linear(config.d_model, 2 * config.d_model)

    class BiasedHead(lm.GPT):
        def __init__(self, config):
            super().__init__(config)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size)
            self.lm_head.weight = self.embed.tok_emb.weight

    message = check("language_models.attention", FusedProjection).message
    assert "no parameter `W_q.weight`" in message and "`in_proj.weight`" in message
    message = check("language_models.attention", Transposed).message
    assert "`W_q.weight` has shape (24, 12)" in message
    assert "`lm_head.bias`" in check("language_models.gpt", BiasedHead).message


def test_a_difference_no_single_mistake_explains_is_located():
    two_in_one_block = checking._variant(
        block._Block, "_PostNormRelu", arrangement="post", activation="relu"
    )
    message = check("language_models.block", two_in_one_block).message
    assert "although its attention matches" in message
    no_mask = checking._variant(attention._Attention, "_NoMaskToo", mask="none")
    post_norm_without_mask = checking._variant(
        gpt._GPT, "_PostNormNoMask", block=block.BLOCK_ONLY_MISTAKES[0].wrong, attention=no_mask
    )
    message = check("language_models.gpt", post_norm_without_mask).message
    assert message.startswith("block 0: ") and attention.WHY_NO_MASK in message
    off_by_one_without_final_norm = checking._variant(
        gpt._GPT, "_TwoSlips", embedding=lm.embedding._OffByOne, final_norm_used=False
    )
    assert (
        lm.embedding.WHY_POSITIONS_OFF_BY_ONE
        in check("language_models.gpt", off_by_one_without_final_norm).message
    )


def test_solutions_print_the_reference_classes_and_the_helpers_they_call(capsys):
    src = solution("language_models.gpt")
    assert src.startswith("class GPT(nn.Module):") and "self.lm_head.weight = " in src
    assert "_register" not in src and capsys.readouterr().out.strip() == src.strip()
    assert solution("language_models.get_batch").startswith("def get_batch(")
    src = solution("language_models.train_loop")  # scratch's train, after the train_step it calls
    assert src.startswith("def train_step(") and "\ndef train(model, next_batch, recipe" in src
    src = solution("language_models.gpt_cached")
    assert src.startswith("class CachedAttention(CausalSelfAttention):")
    assert src.index("class CachedBlock(Block):") < src.index("class CachedGPT(GPT):")


def test_the_training_checker_sees_every_setting_of_the_recipe():
    """The checker's recipe differs from AdamW's defaults and clips, so each setting matters."""
    cfg = training._TRAIN_RECIPE.train
    assert cfg.betas != (0.9, 0.999) and cfg.weight_decay > 0 and cfg.warmup_steps < 6
    assert cfg.max_steps > 6  # an unstretched schedule decays over other steps
    losses = training._expected_train(training._train_case()[0])["the training losses"]
    assert losses[-1] < losses[0] and math.isfinite(losses.sum())


def test_a_model_without_its_config_is_told_to_keep_it():
    class Forgetful(lm.GPT):
        def __init__(self, config):
            super().__init__(config)
            del self.config

    assert "self.config" in check("language_models.gpt", Forgetful).message


# ----------------------------------------------------------------------------------------------
# What a learner who did the whole lab met: each mistake planted, with the message it gets


def test_generate_is_checked_against_the_sliding_window_and_the_package_only_within_the_context():
    """Past the context the package's window jumps (its cache is rebuilt once per jump), the lab's
    slides: a learner's generate that slides passes, one that reuses the package's generate fails
    past the context and is told why; within the context the reference and the package agree."""
    cases = generation._generate_cases()
    assert [generation._within_context(c) for c in cases] == [True, True, False, False]
    for case in cases:
        expected = generation._expected_generate(case)
        if generation._within_context(case):
            assert torch.equal(expected["the tokens"], expected[generation._PACKAGE])
    # the checker's weights make the two windows choose other tokens past the context
    config, idx, n, _ = cases[2]
    package = tc.language_models.generate(lm.package_gpt(config), idx, n, greedy=True)
    assert not torch.equal(package, generation._expected_generate(cases[2])["the tokens"])

    def the_packages_generate(
        model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None
    ):
        return tc.language_models.generate(
            model, idx, max_new_tokens, temperature, greedy=greedy, generator=generator
        )

    feedback = check("language_models.generate", the_packages_generate)
    assert (
        generation.WHY_GEN_JUMPING_WINDOW in feedback.message
        and "past the context" in feedback.message
    )
    passed = check("language_models.generate", lm.generate).message
    assert "sliding-window reference" in passed and "fits in the context" in passed
    assert "jumps" in passed


def test_a_mask_that_hides_the_diagonal_is_named_not_called_an_overflow():
    def masks_the_diagonal(S):
        N = S.shape[-1]
        hidden = torch.ones(N, N, dtype=torch.bool).triu()  # the diagonal too
        return torch.softmax(S.masked_fill(hidden, float("-inf")), dim=-1)

    message = check("language_models.mit_causal_weights", masks_the_diagonal).message
    assert warmups.WHY_MASKED_DIAGONAL in message and "overflow" not in message
    assert "first query has no key left" in message

    class HidesDiagonal(lm.CausalSelfAttention):
        def forward(self, X):
            B, N, D = X.shape
            Q, K, V = (
                W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
                for W in (self.W_q, self.W_k, self.W_v)
            )
            S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
            S = S.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool)), float("-inf"))
            return self.W_o((torch.softmax(S, dim=-1) @ V).transpose(1, 2).reshape(B, N, D))

    message = check("language_models.attention", HidesDiagonal).message
    assert attention.WHY_MASK_HIDES_DIAGONAL in message and "first query has no key left" in message


def _learner_attention(split):
    """A learner's attention that splits its heads with ``split(T, B, N, H, d_k)``."""

    class Split(lm.CausalSelfAttention):
        def forward(self, X):
            B, N, D = X.shape
            Q, K, V = (split(W(X), B, N, self.H, self.d_k) for W in (self.W_q, self.W_k, self.W_v))
            S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
            future = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
            A = torch.softmax(S.masked_fill(future, float("-inf")), dim=-1)
            return self.W_o((A @ V).transpose(1, 2).reshape(B, N, D))

    return Split


def test_heads_split_wrongly_are_named_not_given_as_a_largest_error():
    without_transpose = _learner_attention(lambda T, B, N, H, d: T.view(B, N, H, d))
    message = check("language_models.attention", without_transpose).message
    assert attention.WHY_SPLIT_NO_TRANSPOSE in message and "largest error" not in message
    d_k_first = _learner_attention(lambda T, B, N, H, d: T.view(B, N, d, H).permute(0, 3, 1, 2))
    message = check("language_models.attention", d_k_first).message
    assert attention.WHY_SPLIT_D_K_FIRST in message
    # a split no variant makes (the heads in reverse order): with one head it is right, so it is named
    reversed_heads = _learner_attention(
        lambda T, B, N, H, d: T.view(B, N, H, d).transpose(1, 2).flip(1)
    )
    message = check("language_models.attention", reversed_heads).message
    assert "with one head (H = 1) your layer matches" in message and "largest error" not in message
    assert check(
        "language_models.attention",
        _learner_attention(lambda T, B, N, H, d: T.view(B, N, H, d).transpose(1, 2)),
    )


def test_an_unstretched_schedule_is_named_not_the_order_of_the_step():
    def unstretched(model, next_batch, recipe, steps, seed=0):
        cfg = recipe.train  # the recipe's own 1,000 steps
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

    message = check("language_models.train_loop", unstretched).message
    assert (
        "recipe.with_steps(steps).train" in message and "max_steps (1000 in this check)" in message
    )
    assert "the 6 steps you train for" in message and "order of a step" not in message


def _learner_cached(attention_forward):
    """A learner's cached GPT (the reference's, but for its attention's forward)."""
    attn = type("LearnerCachedAttention", (lm.CachedAttention,), {"forward": attention_forward})

    class Block_(lm.CachedBlock):
        def __init__(self, config):
            super().__init__(config)
            self.attn = attn(config)

    class Model(lm.CachedGPT):
        def __init__(self, config):
            super().__init__(config)
            self.blocks = nn.ModuleList([Block_(config) for _ in range(config.n_layers)])

    return Model


def test_a_cache_updated_after_the_scores_is_named_not_left_to_a_shape_error():
    def update_after_scores(self, X, cache=None):
        B, N, D = X.shape
        Q, K, V = (
            W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
            for W in (self.W_q, self.W_k, self.W_v)
        )
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if cache is not None:
            K, V = cache.update(K, V)
        M = K.shape[2]
        S = S.masked_fill(torch.ones(N, M, dtype=torch.bool).triu(M - N + 1), float("-inf"))
        return self.W_o((torch.softmax(S, dim=-1) @ V).transpose(1, 2).reshape(B, N, D))

    feedback = check("language_models.gpt_cached", _learner_cached(update_after_scores))
    assert kv_cache.WHY_UPDATE_AFTER_SCORES in feedback.message, feedback.message

    def square_mask(self, X, cache=None):  # part 2's mask kept: (N, N)
        B, N, D = X.shape
        Q, K, V = (
            W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
            for W in (self.W_q, self.W_k, self.W_v)
        )
        if cache is not None:
            K, V = cache.update(K, V)
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        return self.W_o((torch.softmax(S, dim=-1) @ V).transpose(1, 2).reshape(B, N, D))

    feedback = check("language_models.gpt_cached", _learner_cached(square_mask))
    assert kv_cache.WHY_SQUARE_MASK in feedback.message, feedback.message

    def late_and_summed(
        self, X, cache=None
    ):  # a shape error no variant makes: advice, and the line
        B, N, D = X.shape
        Q, K, V = (
            W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
            for W in (self.W_q, self.W_k, self.W_v)
        )
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if cache is not None:
            K, V = cache.update(K, V)
        A = torch.softmax(
            S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf")), -1
        )
        return self.W_o((A @ V).transpose(1, 2).reshape(B, N, D))

    feedback = check("language_models.gpt_cached", _learner_cached(late_and_summed))
    assert feedback.status == "error" and kv_cache.WHY_CACHED_SHAPES in feedback.message
    assert "(A @ V)" in feedback.message  # the learner's line


def test_a_crash_inside_pytorch_quotes_the_learners_line_not_torchs():
    def unflattened(logits, tokens):
        return F.cross_entropy(logits, tokens[:, 1:])

    message = check("language_models.teacher_forcing_loss", unflattened).message
    assert "F.cross_entropy(logits, tokens[:, 1:])" in message and "torch._C" not in message

    class WrongNorm(lm.Block):
        def forward(self, X):
            return self.mlp(F.layer_norm(X, (3,)))

    message = check("language_models.block", WrongNorm).message
    assert "F.layer_norm(X, (3,))" in message and "torch" not in message.split("line")[-1]


def _learner_generate_cached(check_needs: int, last_pass: bool):
    """A learner's generate_cached that refuses a request when the prompt and the new tokens need more
    than ``block_size + check_needs`` positions (no check when ``check_needs`` is None), and that runs
    the model on the last new token too when ``last_pass``."""

    def generate_cached(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        if check_needs is not None and (
            idx.shape[1] + max_new_tokens > model.config.block_size + check_needs
        ):
            raise ValueError("too long for the context")
        caches = [lm.KVCache() for _ in range(model.config.n_layers)]
        logits = model(idx, caches=caches)[0][:, -1]
        for step in range(max_new_tokens):
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = (
                logits.argmax(dim=-1, keepdim=True)
                if greedy
                else torch.multinomial(probs, 1, generator=generator)
            )
            idx = torch.cat([idx, nxt], dim=1)
            if last_pass or step < max_new_tokens - 1:
                logits = model(nxt, caches=caches)[0][:, -1]
        return idx

    return generate_cached


def test_generate_cached_must_raise_a_value_error_before_it_starts():
    no_check = _learner_generate_cached(None, last_pass=False)
    feedback = check("language_models.generate_cached", no_check)
    assert kv_cache.WHY_CACHED_NO_CONTEXT_CHECK in feedback.message, feedback.message
    assert "max_new_tokens - 1 <= model.config.block_size" in feedback.message
    checks_first = _learner_generate_cached(1, last_pass=False)  # T + n - 1 <= C
    assert check("language_models.generate_cached", checks_first).status == "correct"


def test_a_pass_on_the_last_token_and_a_check_that_refuses_a_fitting_request_are_named():
    """The lab's first reference ran the model once more after the last token, so it demanded
    T + n <= C; the last token is never fed, and T + n - 1 <= C is enough. Both halves of that
    mistake are named on a request that just fits (T + n - 1 = C), not left to a bare ValueError."""
    case = kv_cache._generate_cached_cases()[0]
    config, idx, n, _ = case
    assert idx.shape[1] + n - 1 == config.block_size  # the first case just fits
    old_reference = _learner_generate_cached(0, last_pass=True)  # T + n <= C, and the extra pass
    message = check("language_models.generate_cached", old_reference).message
    assert kv_cache.WHY_CACHED_CHECK_TOO_STRICT in message, message
    extra_pass = _learner_generate_cached(1, last_pass=True)  # the right check, the extra pass
    message = check("language_models.generate_cached", extra_pass).message
    assert kv_cache.WHY_CACHED_LAST_PASS in message, message
    assert "shared" not in message  # the error at the (n + 1)-th pass is not a shared cache's
    # the reference runs n passes (the prompt, then n - 1 new tokens) and so fits exactly
    model = copy.deepcopy(lm.package_gpt(config))
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    out = lm.generate_cached(model, idx, n, greedy=True)
    assert out.shape[1] == config.block_size + 1 and len(calls) == n


def test_the_targets_of_gpt_forward_are_already_shifted_and_both_docstrings_say_so():
    assert (
        "unshifted" in lm.teacher_forcing_loss.__doc__
        and "twice" in lm.teacher_forcing_loss.__doc__
    )
    assert "already shifted" in scratch.GPT.forward.__doc__

    class ReusesTheWarmUp(lm.GPT):
        def forward(self, idx, targets=None):
            logits, _ = super().forward(idx)
            return logits, None if targets is None else lm.teacher_forcing_loss(logits, targets)

    class ShiftsAgain(lm.GPT):
        def forward(self, idx, targets=None):
            logits, _ = super().forward(idx)
            if targets is None:
                return logits, None
            return logits, lm.teacher_forcing_loss(logits[:, :-1], targets)

    assert gpt.WHY_WARM_UP_LOSS_REUSED in check("language_models.gpt", ReusesTheWarmUp).message
    assert gpt.WHY_TARGETS_SHIFTED_AGAIN in check("language_models.gpt", ShiftsAgain).message


def test_the_gelu_message_says_gpt2_used_the_tanh_approximation():
    assert "as GPT-2 does" not in block.WHY_RELU and "tanh approximation" in block.WHY_RELU

    class TanhBlock(lm.Block):
        def __init__(self, config):
            super().__init__(config)
            self.mlp[1] = nn.GELU(approximate="tanh")

    assert block.WHY_TANH_GELU in check("language_models.block", TanhBlock).message


def test_a_gpt_that_does_not_start_from_gpt2s_initialisation_is_told():
    class DefaultInit(lm.GPT):  # the reference, its weights put back to PyTorch's defaults
        def __init__(self, config):
            super().__init__(config)
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    module.reset_parameters()

    class NoResidualScale(lm.GPT):
        def __init__(self, config):
            super().__init__(config)
            self.apply(tc.language_models.gpt2_init)  # N(0, 0.02) everywhere, W_o too

    message = check("language_models.gpt", DefaultInit).message
    assert "GPT-2-style initialisation (nanoGPT's)" in message and "standard deviation" in message
    message = check("language_models.gpt", NoResidualScale).message
    assert "W_o.weight` has standard deviation 0.02, the initialisation's is 0.01" in message


# ----------------------------------------------------------------------------------------------
# Part 7: the learner's GPT trained inline, or the chapter's run when every part is the reference

TINY_RECIPE = tc.language_models.LMRecipe(  # a few cheap steps on the real text
    model=GPTConfig(vocab_size=65, block_size=16, n_layers=1, H=2, d_model=16, dropout=0.0),
    train=tc.train.TrainConfig(max_steps=1000, lr=3e-3, warmup_steps=2),
    batch_size=4,
    eval_batches=2,
)


def test_training_the_references_inline_is_the_chapters_run():
    """``train_gpt`` trains the learner's classes inline; with the reference solutions (here passed
    as wrappers, so that the inline path runs) it gives exactly the losses, weights and validation
    loss of the chapter's ``train_scratch_gpt``, which it returns instead when it is handed the
    references themselves: the shortcut of the nbval run is the same computation."""
    chapter = tc.language_models.train_scratch_gpt(TINY_RECIPE, 4, seed=1)
    inline = lm.train_gpt(
        scratch.GPT,
        lambda *args: tc.data.get_batch(*args),  # the reference, not the reference object
        lambda *args: scratch.train(*args),
        TINY_RECIPE,
        4,
        seed=1,
    )
    shortcut = lm.train_gpt(scratch.GPT, tc.data.get_batch, scratch.train, TINY_RECIPE, 4, seed=1)
    for run in (inline, shortcut):
        assert run.losses == chapter.losses and len(run.losses) == 4
        assert run.val_loss == chapter.val_loss
        assert run.model.state_dict().keys() == chapter.model.state_dict().keys()
        for k, v in chapter.model.state_dict().items():
            assert torch.equal(run.model.state_dict()[k], v), k
        assert torch.equal(run.val_ids, chapter.val_ids)
    assert chapter.losses[0] > chapter.losses[-1]  # it learns: the steps are not a no-op
    other = lm.train_gpt(scratch.GPT, tc.data.get_batch, scratch.train, TINY_RECIPE, 4, seed=2)
    assert other.losses != chapter.losses  # the seed decides


def test_the_chapters_run_is_reusable_and_keyed_by_plain_values(monkeypatch, tmp_path):
    """``train_scratch_gpt`` is a ``reusable_run``: with the run store set, a second identical call
    (the lab's, after the chapter's) loads the first one's run instead of training again."""
    fn = tc.language_models.train_scratch_gpt
    assert fn.__wrapped__.__module__ == "transformer_course.language_models.recipe"
    monkeypatch.setenv(tc.runtime.RUN_STORE_ENV, str(tmp_path))
    first = fn(TINY_RECIPE, 2)
    stored = list(tmp_path.glob("train_scratch_gpt-*.pt"))
    assert len(stored) == 1
    monkeypatch.setattr(scratch, "train", lambda *args: pytest.fail("trained twice"))
    again = lm.train_gpt(scratch.GPT, tc.data.get_batch, scratch.train, TINY_RECIPE, 2)
    assert again.losses == first.losses and again.val_loss == first.val_loss


# ----------------------------------------------------------------------------------------------
# Mistakes a referee planted that the checkers once misnamed (or only called "values differ")


def test_top_k_that_keeps_k_plus_one_or_k_minus_one_is_told_which():
    def sorted_index_k(z, k):  # the (k + 1)-th largest as the threshold: k + 1 kept
        kth = torch.sort(z, dim=-1, descending=True).values[..., k : k + 1]
        return torch.softmax(z.masked_fill(z < kth, float("-inf")), dim=-1)

    def strictly_greater(z, k):  # z > kth drops the k-th largest itself: k - 1 kept
        kth = torch.topk(z, k, dim=-1).values[..., -1:]
        return torch.softmax(z.masked_fill(~(z > kth), float("-inf")), dim=-1)

    message = check("language_models.top_k_probs", sorted_index_k).message
    assert warmups.WHY_TOP_K_PLUS_ONE in message and "z >= kth, not z > kth" not in message
    message = check("language_models.top_k_probs", strictly_greater).message
    assert warmups.WHY_TOP_K_MINUS_ONE in message and "values differ" not in message


def test_scores_divided_by_d_k_are_named_not_given_as_a_largest_error():
    class DividedByDk(lm.CausalSelfAttention):
        def forward(self, X):
            B, N, D = X.shape
            Q, K, V = (
                W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
                for W in (self.W_q, self.W_k, self.W_v)
            )
            S = Q @ K.transpose(-2, -1) / self.d_k  # d_k, not its square root
            S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
            return self.W_o((torch.softmax(S, dim=-1) @ V).transpose(1, 2).reshape(B, N, D))

    message = check("language_models.attention", DividedByDk).message
    assert attention.WHY_SCALE_NO_ROOT in message and "largest error" not in message


def test_adam_with_weight_decay_is_named_not_the_schedule():
    def adam_l2(model, next_batch, recipe, steps, seed=0):
        cfg = recipe.with_steps(steps).train
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.Adam(  # L2: the decay joins the gradient
            [{"params": matrices, "weight_decay": cfg.weight_decay},
             {"params": others, "weight_decay": 0.0}],
            lr=cfg.lr, betas=cfg.betas,
        )  # fmt: skip
        gen, losses = torch.Generator().manual_seed(seed), []
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

    message = check("language_models.train_loop", adam_l2).message
    assert training.WHY_ADAM_L2 in message and "AdamW" in message
    assert "order of a step" not in message and "schedule" not in message


def test_the_keep_mask_passed_to_masked_fill_is_named_not_called_an_overflow():
    def keep_mask_filled(S):
        N = S.shape[-1]
        keep = torch.ones(N, N, dtype=torch.bool).tril()  # True where a key may be seen
        return torch.softmax(S.masked_fill(keep, float("-inf")), dim=-1)  # fills the kept keys

    message = check("language_models.mit_causal_weights", keep_mask_filled).message
    assert warmups.WHY_KEEP_MASK_FILLED in message and "overflow" not in message


def test_the_sampling_distributions_rows_are_not_called_attention_weights():
    message = check(
        "language_models.temperature_probs", lambda z, tau: 2 * torch.softmax(z / tau, -1)
    ).message
    assert "rows of the sampling distribution must sum to one" in message
    assert "attention" not in message
    message = check(
        "language_models.temperature_probs", lambda z, tau: torch.softmax(z / tau, dim=0)
    ).message
    assert "over the vocabulary" in message and "keys" not in message


def test_positions_looked_up_with_the_token_ids_are_named_not_left_to_an_index_error():
    class PositionsFromIds(lm.Embedding):
        def forward(self, idx):
            return self.tok_emb(idx) + self.pos_emb(idx)  # the ids, not the positions

    feedback = check("language_models.embedding", PositionsFromIds)
    assert feedback.status == "incorrect", str(feedback)
    assert embedding.WHY_POSITIONS_FROM_TOKEN_IDS in feedback.message
