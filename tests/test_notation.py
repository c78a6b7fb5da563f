"""Turner's column form equals the course's row form, number for number; and the glossary guard.

The glossary guard (issue 22, "Notation"): the glossary of ``book/notation.md`` is the authority for
the symbols the chapters share, and no chapter may list one of them among its own symbols.

How a symbol is written in the glossary of ``book/notation.md`` and in a chapter's front matter.

* The glossary is the Markdown table under ``## Glossary`` whose header is
  ``| symbol | code | shape | meaning |``. Its symbol cell holds one or more ``$...$`` spans separated
  by commas and nothing else; each symbol maps to the row's meaning. No cell may contain a bare ``|``
  (write ``\\lvert``/``\\rvert``).
* A chapter lists the symbols it defines itself in its front matter, ``local_symbols:``, a YAML
  mapping from the symbol's LaTeX source (single-quoted, with or without the surrounding ``$``; a
  key may also list several ``$...$`` spans) to its meaning.
* Two symbols are the same when their normal forms (:func:`normalise`) agree: whitespace removed
  (except the one space that ends a control word before a letter), a one-token subscript,
  superscript or font argument put in braces (``W_o`` = ``W_{o}``, ``\\mathbf x`` = ``\\mathbf{x}``),
  ``\\mathrm`` read as ``\\text``. The font is part of a symbol (``\\mathcal{M}`` is not ``M``), but a
  bold letter is no new symbol: a chapter's ``\\mathbf{s}_n`` clashes with the glossary's ``s_n``
  (:func:`unbold`).

One symbol is defined once. The guard fails on a symbol listed twice in the glossary or in one page's
``local_symbols`` (a repeated YAML key, or two spellings of one symbol such as ``W_p`` and ``W_{p}``);
on a glossary letter that also names the entries of another glossary symbol (``s`` an update and
``s_n`` a token id); on a code name given to two glossary rows (``H`` for the heads and for the height
of an image); on a chapter's own symbol that is a glossary symbol; and on a symbol that a chapter and
its *Going deeper* page both list with different meanings.
"""

from __future__ import annotations

import re

import pytest
import torch
import yaml
from pages import CHAPTERS, DEEPER, ROOT

from transformer_course.notation import (
    columns_to_rows,
    rows_to_columns,
    turner_attention,
    turner_self_attention,
)
from transformer_course.self_attention import attention_weights, single_head


@pytest.mark.parametrize(("N", "D", "d_k", "d_v"), [(1, 3, 2, 3), (6, 8, 4, 8), (9, 5, 5, 2)])
def test_column_form_equals_row_form(N, D, d_k, d_v, gen):
    X = torch.randn(N, D, generator=gen, dtype=torch.float64)
    W_q, W_k = (torch.randn(D, d_k, generator=gen, dtype=torch.float64) for _ in range(2))
    W_v = torch.randn(D, d_v, generator=gen, dtype=torch.float64)
    X_cols, U_q, U_k, U_v = rows_to_columns(X), W_q.T, W_k.T, W_v.T
    A_cols = turner_attention(X_cols, U_q, U_k)
    torch.testing.assert_close(A_cols.sum(0), torch.ones(N, dtype=torch.float64))  # columns
    torch.testing.assert_close(A_cols, attention_weights(X @ W_q, X @ W_k).T, atol=1e-12, rtol=0)
    Y_cols = turner_self_attention(X_cols, U_q, U_k, U_v)
    torch.testing.assert_close(
        columns_to_rows(Y_cols), single_head(X, W_q, W_k, W_v), atol=1e-12, rtol=0
    )


def test_turner_form_by_its_sum(gen):
    # y_n = sum_{n'} U_v x_{n'} A_{n',n}, evaluated term by term.
    X_cols = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    U_q, U_k, U_v = (torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    A = turner_attention(X_cols, U_q, U_k, scale=1.0)
    Y = turner_self_attention(X_cols, U_q, U_k, U_v, scale=1.0)
    for n in range(5):
        y_n = sum(U_v @ X_cols[:, m] * A[m, n] for m in range(5))
        torch.testing.assert_close(Y[:, n], y_n)


def test_transposed_U_is_diagnosed():
    with pytest.raises(ValueError, match="looks transposed"):
        turner_attention(torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 4))


def test_every_shape_error_names_the_shape_it_refuses():
    # book/notation.md: Turner's functions raise a ValueError that says what they expect.
    X_cols = torch.randn(4, 5)
    with pytest.raises(ValueError, match=r"U_q has shape \(2, 4\) but U_k has shape \(3, 4\)"):
        turner_attention(X_cols, torch.randn(2, 4), torch.randn(3, 4))  # widths differ
    with pytest.raises(ValueError, match=r"X_cols has shape \(2, 4, 5\)"):
        turner_attention(torch.randn(2, 4, 5), torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"U_v has shape \(3, 5\) but must be \(d_v, D\)"):
        turner_self_attention(X_cols, torch.randn(2, 4), torch.randn(2, 4), torch.randn(3, 5))


def test_round_trip():
    X = torch.randn(2, 3, 4)
    assert torch.equal(columns_to_rows(rows_to_columns(X)), X)
    assert rows_to_columns(X).shape == (2, 4, 3)


@pytest.mark.parametrize(("D", "H", "N"), [(4, 1, 3), (8, 2, 5), (12, 4, 6)])
def test_turner_multi_head_equals_concat_form(D, H, N, gen):
    """sum_h U_o,h X A_h == concat(heads) W_o, with U_o,h = (W_v^(h) W_o^(h))^T of rank <= D/H."""
    from transformer_course.multihead import multi_head_attention_reference
    from transformer_course.notation import low_rank_V, turner_multi_head_self_attention

    X = torch.randn(N, D, generator=gen, dtype=torch.float64)
    W_q, W_k, W_v, W_o = (torch.randn(D, D, generator=gen, dtype=torch.float64) for _ in range(4))
    d_k = D // H
    U_q = torch.stack([W_q[:, h * d_k : (h + 1) * d_k].T for h in range(H)])  # (H, d_k, D)
    U_k = torch.stack([W_k[:, h * d_k : (h + 1) * d_k].T for h in range(H)])
    U_o = low_rank_V(W_v, W_o, H)  # Turner's V_h
    assert all(torch.linalg.matrix_rank(U_o[h]) <= d_k for h in range(H))
    Y_cols = turner_multi_head_self_attention(X.T, U_q, U_k, U_o)
    Y = multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
    torch.testing.assert_close(Y_cols.T, Y, atol=1e-10, rtol=0)


def test_column_form_takes_one_sequence_and_says_so():
    # book/notation.md: Turner's functions take one D x N sequence; the row-form functions take
    # (..., N, D) and give each sequence the same answer as on its own.
    X_cols = torch.randn(2, 4, 5, dtype=torch.float64)  # a batch (B, D, N): not accepted
    U = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="D x N"):
        turner_attention(X_cols, U, U)
    with pytest.raises(ValueError, match="D x N"):
        turner_self_attention(X_cols, U, U, U)
    X = torch.randn(2, 3, 5, 4, dtype=torch.float64)  # (..., N, D) with two leading dimensions
    W = torch.randn(4, 3, dtype=torch.float64)
    Y = single_head(X, W, W, W)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(
                Y[i, j],
                columns_to_rows(turner_self_attention(rows_to_columns(X[i, j]), W.T, W.T, W.T)),
                atol=1e-12,
                rtol=0,
            )


# --------------------------------------------------------------------------------------------------
# The glossary guard (issue 22, "Notation"): one meaning per shared symbol.
# --------------------------------------------------------------------------------------------------


GLOSSARY_PAGE = ROOT / "book" / "notation.md"
_GLOSSARY_HEADER = "| symbol | code | shape | meaning |"
_MATH_SPAN = re.compile(r"\$([^$]+)\$")
_ONE_TOKEN = r"(\\[A-Za-z]+|[^\s{}\\])"
_FONTS = r"mathbf|boldsymbol|bm|pmb|mathcal|mathbb|mathrm|mathit|mathsf|mathfrak|text|operatorname"
_BOLD = re.compile(r"\\(?:mathbf|boldsymbol|bm|pmb)\{((?:[^{}]|\{[^{}]*\})*)\}")


def normalise(symbol: str) -> str:
    """The normal form of a symbol's LaTeX source, for comparing two spellings of one symbol."""
    s = symbol.strip()
    if s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    s = re.sub(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])", lambda m: m.group(1) + "\x00", s)
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = re.sub(rf"\\({_FONTS})(?!\{{)\s*{_ONE_TOKEN}", r"\\\1{\2}", s)
    s = re.sub(rf"([_^])(?!\{{)(\\(?:{_FONTS})\{{[^{{}}]*\}}|{_ONE_TOKEN})", r"\1{\2}", s)
    return s.replace("\\mathrm{", "\\text{")


def unbold(symbol: str) -> str:
    """A normal form with bold removed: ``\\mathbf{s}_{n}`` -> ``s_{n}``."""
    s = normalise(symbol)
    while (t := _BOLD.sub(r"\1", s)) != s:
        s = t
    return s


def _split_commas(text: str) -> list[str]:
    """``text`` split at the commas outside braces: ``a_{n,m}, b`` -> ``a_{n,m}``, ``b``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, text[start:]] if p.strip()]


def _symbols_of(cell: str) -> list[str]:
    """The symbols of a glossary cell or a local_symbols key: ``$...$`` spans separated by commas, or
    (in a key without ``$``) LaTeX symbols separated by commas outside braces."""
    spans = _MATH_SPAN.findall(cell)
    if not spans:
        return _split_commas(cell)
    rest = _MATH_SPAN.sub("", cell)
    if rest.replace(",", "").strip():
        raise ValueError(f"{cell!r}: only $...$ spans separated by commas may stand here")
    return spans


_CODE_SPAN = re.compile(r"`([^`]+)`")
# an entry of a symbol: one letter or digit as its subscript (``s_{n}``, ``\\mathbf{x}_{n}``, ``\\Phi_{k}``)
_ENTRY = re.compile(r"^(.+)_\{([A-Za-z0-9]|\\ell)\}$")


def glossary_rows(text: str) -> list[tuple[list[str], list[str], str]]:
    """(symbols, code names, meaning) for each row of the glossary table of ``text``."""
    head = text.index("\n## Glossary\n")
    start = text.index(_GLOSSARY_HEADER, head)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            raise ValueError(f"glossary row {line!r} has {len(cells)} cells, not 4 (a bare '|'?)")
        rows.append((_symbols_of(cells[0]), _CODE_SPAN.findall(cells[1]), cells[3]))
    return rows


def glossary(text: str | None = None) -> dict[str, str]:
    """The glossary of ``book/notation.md`` as normal form of a symbol -> meaning.

    Raises:
        ValueError: a symbol is listed twice; a letter is a symbol of its own and also names the
            entries of another (``s`` and ``s_n``); a code name stands in two rows; or a row has no
            symbol or no meaning.
    """
    text = GLOSSARY_PAGE.read_text() if text is None else text
    out: dict[str, str] = {}
    code_of: dict[str, str] = {}
    for symbols, codes, meaning in glossary_rows(text):
        if not symbols or not meaning:
            raise ValueError(f"glossary row {symbols!r} needs a symbol and a meaning")
        for symbol in symbols:
            key = normalise(symbol)
            if key in out:
                raise ValueError(f"${symbol}$ is listed twice in the glossary")
            out[key] = meaning
        for code in codes:
            if code in code_of:
                raise ValueError(
                    f"the code name `{code}` stands for ${code_of[code]}$ and ${symbols[0]}$ in the "
                    "glossary; give one of them another name"
                )
            code_of[code] = symbols[0]
    plain = {unbold(key): key for key in out}
    for key in out:
        entry = _ENTRY.match(unbold(key))
        if entry and entry.group(1) in plain and plain[entry.group(1)] != key:
            letter = plain[entry.group(1)]
            raise ValueError(
                f"${letter}$ ({out[letter]!r}) and ${key}$ ({out[key]!r}) give one letter two "
                "meanings in the glossary; rename one of them"
            )
    return out


class _OneKeyOnce(yaml.SafeLoader):
    """YAML's safe loader, except that a mapping may not repeat a key (YAML keeps the last one)."""


def _mapping_with_unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise ValueError(
                f"{key!r} is listed twice in the front matter (YAML keeps the last one)"
            )
        seen.add(key)
    return loader.construct_mapping(node)


_OneKeyOnce.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_unique_keys
)


def front_matter(text: str) -> dict:
    if not text.startswith("---\n"):
        return {}
    return yaml.load(text[4 : text.index("\n---\n", 3)], Loader=_OneKeyOnce) or {}


def local_symbols(text: str) -> dict[str, str] | None:
    """A page's ``local_symbols`` as normal form -> meaning (``None`` if the page has none).

    Raises:
        ValueError: the front matter is not YAML, ``local_symbols`` is not a mapping, or it lists
            one symbol twice (a repeated key, or two spellings with one normal form).
    """
    try:
        listed = front_matter(text).get("local_symbols")
    except yaml.YAMLError as err:
        raise ValueError(
            f"the front matter is not valid YAML (quote a meaning that holds ': '): {err}"
        ) from err
    if listed is None:
        return None
    if not isinstance(listed, dict):
        raise ValueError("local_symbols must be a mapping from a symbol to its meaning")
    out: dict[str, str] = {}
    for key, meaning in listed.items():
        for symbol in _symbols_of(str(key)):
            if normalise(symbol) in out:
                raise ValueError(f"${symbol}$ is listed twice in local_symbols")
            out[normalise(symbol)] = str(meaning or "")
    return out


def _words(meaning: str) -> set[str]:
    return set(re.findall(r"[\w']+", meaning.lower()))


def same_meaning(a: str, b: str) -> bool:
    """Two wordings of one meaning: every word of the shorter is a word of the longer (the longer
    may add a shape or a remark; it may not say something else)."""
    short, long = sorted((_words(a), _words(b)), key=len)
    return short <= long


def defined_twice(chapter: dict[str, str], deeper: dict[str, str]) -> list[str]:
    """The symbols that a chapter and its *Going deeper* page both list with different meanings."""
    return [
        f"${s}$ ({chapter[s]!r} and {deeper[s]!r})"
        for s in deeper
        if s in chapter and not same_meaning(chapter[s], deeper[s])
    ]


def clashes(local: dict[str, str], shared: dict[str, str]) -> list[str]:
    """The local symbols that are glossary symbols, or bold forms of one (or plain forms of a bold
    one), each with both meanings."""
    plain = {unbold(g): g for g in shared}
    found = []
    for symbol, meaning in local.items():
        if symbol in shared:
            found.append(f"${symbol}$ ({meaning!r}) is the glossary's {shared[symbol]!r}")
        elif unbold(symbol) in plain:
            g = plain[unbold(symbol)]
            found.append(f"${symbol}$ ({meaning!r}) is a bold or plain ${g}$: {shared[g]!r}")
    return found


def test_the_glossary_parses_into_one_meaning_per_symbol():
    shared = glossary()
    assert len(shared) >= 40
    for symbol in r"N D W_o s_{n} \mathbf{b} J \mathcal{J} \pi \theta u H_\text{px}".split():
        assert normalise(symbol) in shared, symbol
    assert "output map" in shared[normalise("W_o")]  # the meaning is the last column...
    assert "H d_v" not in shared[normalise("W_o")]  # ...the shape one of its own


def test_normal_forms_compare_spellings_not_fonts():
    assert normalise("$W_{o}$") == normalise("W_o") == normalise(" W _ o ")
    assert normalise(r"\mathbf x_n") == normalise(r"\mathbf{x}_{n}")
    assert normalise(r"W_\mathrm{vocab}") == normalise(r"W_\text{vocab}")
    assert normalise(r"\alpha b") != normalise(r"\alphab")
    assert normalise(r"\mathcal{M}") != normalise("M")
    assert unbold(r"\mathbf{s}_n") == normalise("s_n") == unbold(r"\boldsymbol s_n")
    assert unbold(r"\mathbf{x}_n^{(0)}") == normalise("x_n^{(0)}")


def test_the_guard_catches_a_clash_and_a_duplicate():
    page = (
        "---\nlocal_symbols:\n  'J': the softmax's Jacobian\n  '$\\mathbf{s}_n$': a state\n"
        "  'W_p, \\Theta_{n,m}, \\pi': the patch map, a rotation, a permutation\n---\n# X\n"
    )
    local = local_symbols(page)
    assert normalise(r"\Theta_{n,m}") in local and normalise("W_p") in local
    found = clashes(local, glossary())
    assert len(found) == 3 and "Jacobian" in found[0] and "state" in found[1]
    assert "permutation" in found[2]
    with pytest.raises(ValueError, match="not valid YAML"):
        local_symbols("---\nlocal_symbols:\n  n_1: right ($n$: mean)\n---\n")
    doubled = GLOSSARY_PAGE.read_text().replace("| $N$ | `N` |", "| $N$, $W_{o}$ | `N` |", 1)
    with pytest.raises(ValueError, match="listed twice"):
        glossary(doubled)
    with pytest.raises(ValueError, match="cells, not 4"):
        glossary(GLOSSARY_PAGE.read_text().replace("| $N$ | `N` |", "| $N$ | a|b |", 1))


def test_the_guard_catches_a_symbol_defined_twice():
    """Each way of defining one symbol twice fails: planted in a copy of the real pages."""
    glossary_text = GLOSSARY_PAGE.read_text()
    row = "| $H_\\text{px}$ | `H_px` |"
    assert row in glossary_text
    with pytest.raises(ValueError, match="code name `H` stands for"):  # heads and image height
        glossary(glossary_text.replace(row, "| $H_\\text{px}$ | `H` |", 1))
    step = "| $u$ | `step + 1` | index |"
    assert step in glossary_text
    with pytest.raises(ValueError, match="one letter two meanings"):  # s the step, s_n a token id
        glossary(glossary_text.replace(step, "| $s$ | `step + 1` | index |", 1))
    with pytest.raises(ValueError, match="listed twice in the front matter"):  # a repeated key
        local_symbols("---\nlocal_symbols:\n  'W_p': the patch map\n  'W_p': a weight\n---\n")
    with pytest.raises(ValueError, match="listed twice in local_symbols"):  # two spellings
        local_symbols("---\nlocal_symbols:\n  'W_p': the patch map\n  'W_{p}': a weight\n---\n")
    with pytest.raises(ValueError, match="listed twice in local_symbols"):  # one key, twice
        local_symbols("---\nlocal_symbols:\n  'U_q, U_{q}': a map\n---\n")
    chapter = local_symbols("---\nlocal_symbols:\n  'c': a count of pairs\n---\n")
    deeper = local_symbols("---\nlocal_symbols:\n  'c': the speed of light\n  'r': a rank\n---\n")
    assert defined_twice(chapter, deeper) == ["$c$ ('a count of pairs' and 'the speed of light')"]
    assert not defined_twice(chapter, chapter)  # listed again with its meaning: one definition
    shorter = local_symbols("---\nlocal_symbols:\n  'c': a count\n---\n")
    assert not defined_twice(chapter, shorter)  # the same meaning, said shorter
    # a chapter's symbol with the glossary's letter and another meaning (here the real notation page)
    page = (ROOT / "book" / "notation.md").read_text()
    assert not clashes(local_symbols(page), glossary())
    planted = page.replace("local_symbols:\n", "local_symbols:\n  'H': the height of a patch\n", 1)
    assert clashes(local_symbols(planted), glossary())


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_chapter_gives_a_glossary_symbol_another_meaning(chapter):
    text = (ROOT / f"{chapter}.md").read_text()
    local = local_symbols(text)
    assert local is not None, (
        f"{chapter}: no `local_symbols:` in the front matter; list the symbols the page defines "
        "that are not in the glossary of book/notation.md (an empty mapping {} if none)"
    )
    assert all(local.values()), f"{chapter}: a local symbol without a meaning"
    found = clashes(local, glossary())
    assert not found, (
        f"{chapter}: local symbols that are glossary symbols. Where the page means what the "
        "glossary says, drop the symbol from local_symbols; otherwise rename it on the page (see "
        "book/notation_deeper.md, 'One letter, one meaning'): " + "; ".join(found)
    )


@pytest.mark.parametrize(("chapter", "deeper"), sorted(DEEPER.items()))
def test_a_going_deeper_page_defines_no_symbol_twice(chapter, deeper):
    """A *Going deeper* page reads with its chapter: the symbols it lists are no glossary symbols,
    and a symbol its chapter lists too keeps the chapter's meaning (:func:`same_meaning`)."""
    local = local_symbols((ROOT / f"{deeper}.md").read_text()) or {}
    found = clashes(local, glossary())
    found += defined_twice(local_symbols((ROOT / f"{chapter}.md").read_text()) or {}, local)
    assert not found, f"{deeper}: symbols defined twice: " + "; ".join(found)


@pytest.mark.parametrize(("D", "d_v"), [(4, 4), (6, 3)])
def test_single_head_column_form_is_eq4_with_one_head_only_when_d_v_is_D(D, d_v, gen):
    """notation.turner_self_attention's docstring: with d_v = D it is Turner's eq. 4 with H = 1 and
    V_1 = U_v; with d_v < D his eq. 4 (D x D maps V_h) cannot hold U_v, and the package says so."""
    from transformer_course.notation import turner_multi_head_self_attention

    X_cols = torch.randn(D, 5, generator=gen, dtype=torch.float64)
    U_q, U_k = (torch.randn(2, D, generator=gen, dtype=torch.float64) for _ in range(2))
    U_v = torch.randn(d_v, D, generator=gen, dtype=torch.float64)
    Y = turner_self_attention(X_cols, U_q, U_k, U_v)
    if d_v == D:
        Y4 = turner_multi_head_self_attention(X_cols, U_q[None], U_k[None], U_v[None])
        torch.testing.assert_close(Y, Y4, atol=1e-12, rtol=0)
    else:
        assert Y.shape == (d_v, 5)
        with pytest.raises(ValueError, match=r"\(H, D, D\)"):  # U_v is not D x D: not Turner's V_1
            turner_multi_head_self_attention(X_cols, U_q[None], U_k[None], U_v[None])
