"""Part 8 of lab 7: generation, one token at a time, the model seeing the last ``block_size`` tokens (a
sliding window). The reference solution is ``scratch/gpt.py``'s :func:`generate`.

The checker compares the learner's tokens with the reference everywhere, and with the package's
:func:`~transformer_course.language_models.generate` only within the context: past it, the package's
window jumps by ``block_size // 2`` instead of sliding, so that its key-value cache is rebuilt once
per jump rather than at every token, and the two see different tokens (``tests/test_scratch_gpt.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...language_models import generate as package_generate
from ...language_models import window_start
from ...scratch.gpt import generate
from .. import Mistake
from .checking import (
    _CONFIGS,
    CapstoneExercise,
    Output,
    _register,
    _sizes_of,
    _tensor,
    _Verdict,
    package_gpt,
)


def _wrong_generate(
    position: int = -1,
    crop: str = "last",
    only_new: bool = False,
    last_token: bool = False,
    tau: str = "divide",
    uses_generator: bool = True,
) -> Callable:
    """A generation loop with one typical mistake."""

    def wrong(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        C, T = model.config.block_size, idx.shape[1]
        with torch.no_grad():
            for _ in range(max_new_tokens):
                seen = {
                    "last": idx[:, -C:],
                    "first": idx[:, :C],
                    "none": idx,
                    "jump": idx[:, window_start(idx.shape[1], C) :],  # the package's window
                }[crop]
                logits = model(seen[:, -1:] if last_token else seen)[0][:, position]
                if greedy:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    scaled = {"divide": logits / temperature, "times": logits * temperature}
                    z = scaled.get(tau, logits)  # tau="ignore": the temperature is left out
                    nxt = torch.multinomial(
                        torch.softmax(z, dim=-1), 1, generator=generator if uses_generator else None
                    )
                idx = torch.cat([idx, nxt], dim=1)
        return idx[:, T:] if only_new else idx

    return wrong


WHY_GEN_FIRST_POSITION = (
    "you chose the next token from the first position's logits; the prediction of the next token is "
    "at the last position, logits[:, -1]."
)
WHY_GEN_NO_CROP = (
    "you fed more tokens than the context holds: crop the sequence to its last block_size tokens, "
    "idx[:, -block_size:], before each forward pass."
)
WHY_GEN_CROP_START = (
    "you cropped the sequence to its first block_size tokens; keep the last ones, "
    "idx[:, -block_size:], so that the model sees the most recent context."
)
WHY_GEN_JUMPING_WINDOW = (
    "past the context your window jumps by block_size // 2, as the package's generate does (it "
    "rebuilds its key-value cache once per jump); the lab's generate has no cache and slides its "
    "window one token at a time: feed the last block_size tokens, idx[:, -block_size:]."
)
WHY_GEN_ONLY_NEW = (
    "you returned only the new tokens; return the prompt followed by them, shape "
    "(B, T + max_new_tokens)."
)
WHY_GEN_LAST_TOKEN = (
    "you fed only the newest token to the model, so it predicts from one token of context; without a "
    "cache, feed the whole (cropped) sequence."
)
WHY_GEN_TEMPERATURE_TIMES = (
    "you multiplied the logits by the temperature; divide them, softmax(logits / temperature), so "
    "that a low temperature sharpens the distribution."
)
WHY_GEN_TEMPERATURE_IGNORED = (
    "your samples ignore the temperature: sample from softmax(logits / temperature)."
)
WHY_GEN_IGNORES_GENERATOR = (
    "your samples ignore the generator: the same seed must give the same text, "
    "torch.multinomial(probs, 1, generator=generator)."
)
GENERATE_MISTAKES = [
    Mistake(WHY_GEN_FIRST_POSITION, _wrong_generate(position=0)),
    Mistake(WHY_GEN_NO_CROP, _wrong_generate(crop="none"), "raises"),
    Mistake(WHY_GEN_CROP_START, _wrong_generate(crop="first")),
    Mistake(WHY_GEN_JUMPING_WINDOW, _wrong_generate(crop="jump")),
    Mistake(WHY_GEN_ONLY_NEW, _wrong_generate(only_new=True), "shape"),
    Mistake(WHY_GEN_LAST_TOKEN, _wrong_generate(last_token=True)),
    Mistake(WHY_GEN_TEMPERATURE_TIMES, _wrong_generate(tau="times")),
    Mistake(WHY_GEN_TEMPERATURE_IGNORED, _wrong_generate(tau="ignore")),
    Mistake(WHY_GEN_IGNORES_GENERATOR, _wrong_generate(uses_generator=False)),
]

_PACKAGE = "the tokens, against the package's generate"


def _generate_cases() -> list:
    """(config, prompt, new tokens, options). Within the context (``T + new - 1 <= C``: the last token
    is chosen from at most C tokens) the package's generate chooses the reference's tokens too."""
    c0, c1 = _CONFIGS
    g = torch.Generator().manual_seed(50)
    return [
        (c0, torch.randint(c0.vocab_size, (2, 3), generator=g), c0.block_size - 2, {"greedy": True}),
        (c1, torch.randint(c1.vocab_size, (2, 2), generator=g), c1.block_size - 1,
         {"temperature": 2.0, "seed": 3}),
        (c0, torch.randint(c0.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1)),
         c0.block_size + 4, {"greedy": True}),  # here the two windows choose other tokens
        (c0, torch.randint(c0.vocab_size, (2, 2), generator=g), 2 * c0.block_size,
         {"temperature": 2.0, "seed": 7}),
    ]  # fmt: skip


def _within_context(case: tuple) -> bool:
    config, idx, n, _ = case
    return idx.shape[1] + n - 1 <= config.block_size


def _generated(answer: Any, model: nn.Module, idx: Tensor, n: int, options: dict) -> Tensor:
    seed = options.get("seed")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    kwargs = {"greedy": options.get("greedy", False), "generator": generator}
    out = answer(model, idx.clone(), n, options.get("temperature", 1.0), **kwargs)
    return _tensor(out, "generate")


def _observe_tokens(answer: Any, case: tuple, model: nn.Module) -> Output:
    """The tokens ``answer`` generates with ``model``; seeded, the generator alone must decide them (the
    global random state stays put, and a second run gives the same tokens)."""
    _, idx, n, options = case
    state = torch.random.get_rng_state()  # a sample drawn without the generator moves it
    out = _generated(answer, model, idx, n, options)
    if options.get("seed") is not None:
        if not torch.equal(torch.random.get_rng_state(), state):
            raise _Verdict(WHY_GEN_IGNORES_GENERATOR)
        again = _generated(answer, model, idx, n, options)
        if again.shape != out.shape or not torch.equal(again, out):
            raise _Verdict(WHY_GEN_IGNORES_GENERATOR)
    return {"the tokens": out}


def _observe_generate(answer: Any, case: tuple) -> Output:
    model = copy.deepcopy(package_gpt(case[0]))  # the answer may change its mode or its device
    out = _observe_tokens(answer, case, model)["the tokens"]
    return {"the tokens": out, _PACKAGE: out} if _within_context(case) else {"the tokens": out}


def _expected_generate(case: tuple) -> Output:
    """The reference's tokens (a sliding window) and, within the context, the package's (no cache)."""
    config, idx, n, options = case
    expected = {"the tokens": _observe_generate(generate, case)["the tokens"]}
    if _within_context(case):
        seed = options.get("seed")
        expected[_PACKAGE] = package_generate(
            package_gpt(config),
            idx,
            n,
            temperature=options.get("temperature", 1.0),
            greedy=options.get("greedy", False),
            use_cache=False,
            generator=None if seed is None else torch.Generator().manual_seed(seed),
        )
    return expected


def _describe_generation(case: tuple) -> str:
    config, idx, n, options = case
    how = "greedy" if options.get("greedy") else f"temperature {options['temperature']}, seeded"
    where = "within the context" if _within_context(case) else "past the context"
    return f"case: {_sizes_of(config)}; prompt {tuple(idx.shape)}, {n} new tokens ({where}), {how}"


_register(
    CapstoneExercise(
        name="language_models.generate",
        prompt=(
            "Write generate(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None): "
            "extend idx (B, T) one token at a time, feeding the model the last block_size tokens (a "
            "sliding window) and choosing the next token from the last position's logits, the "
            "arg-max when greedy, else a sample of softmax(logits / temperature) drawn with the "
            "generator; return (B, T + max_new_tokens)."
        ),
        solution=generate,
        mistakes=GENERATE_MISTAKES,
        cases=_generate_cases,
        observe=_observe_generate,
        expected=_expected_generate,
        describe=_describe_generation,
        kind="function",
        atol=0.0,
        rtol=0.0,
        passed="the same tokens as the sliding-window reference (scratch.gpt.generate), and as the "
        "package's generate while the sequence fits in the context (past it, the package's window "
        "jumps),",
        registered_by=__name__,
    )
)
