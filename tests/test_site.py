"""The built site in a real headless browser, with the network cut off: it must read offline.

Uses Debian's chromium (``/usr/bin/chromium``, or ``$CHROMIUM``) driven by Playwright (``conftest.py``'s
``browser`` fixture); no browser is downloaded. Without chromium these tests are skipped, unless
``COURSE_REQUIRE_BROWSER=1`` (set by CI), in which case they fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import threading
from collections.abc import Iterator

import pages
import pytest

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = pages.toc_pages()
# The pages whose test takes longest (8 to 15 s each on a 2-core machine, most others 3 to 7 s) are
# tested first, so that no worker is left with a long page while the other has finished.
SLOW_FIRST = [
    "book/sources",
    "book/exercises",
    "book/extensions_deeper",
    "book/equations",
    "book/relations_deeper",
    "book/training_deeper",
]
SCREENSHOTS = pathlib.Path(os.environ.get("COURSE_SCREENSHOTS", ROOT / "_build" / "screenshots"))

pytestmark = pytest.mark.site


@pytest.fixture(scope="module")
def site(built_book: pathlib.Path) -> Iterator[str]:
    """Serve the built site on the loopback interface only."""
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _watch(page, site: str):
    """``page``, recording its JavaScript errors, console errors and warnings and failed requests to
    the local site in ``page.errors``, and its requests to other sites (which fail: ``conftest.ARGS``) in
    ``page.blocked``."""
    page.blocked, page.errors = [], []
    page.on("pageerror", lambda err: page.errors.append(f"page error: {err}"))
    page.on(
        "console",
        lambda msg: (
            page.errors.append(f"console {msg.type}: {msg.text} ({msg.location.get('url')})")
            if msg.type in ("error", "warning") and "[PST]" not in msg.text
            else None
        ),
    )
    page.on(
        "requestfailed",
        lambda r: (
            page.errors.append(f"failed request: {r.url}")
            if r.url.startswith(site)
            else page.blocked.append((r.resource_type, r.url))
        ),
    )
    return page


def _open(browser, site, **context_options):
    """A watched page (``_watch``) in a new context of its own."""
    context = browser.new_context(**context_options)
    return context, _watch(context.new_page(), site)


DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def reader(browser, site):
    """One context for the visits of the site's pages, as one reader's tabs: its pages share the
    HTTP cache and the compiled scripts (seven visits took 7.3 s, against 10.5 s in contexts of their
    own, on a 2-core AMD EPYC). Storage is cleared before every page's own scripts run, so every visit
    is a first visit."""
    context = browser.new_context(viewport=DESKTOP)
    context.add_init_script("try { localStorage.clear(); sessionStorage.clear(); } catch (e) {}")
    yield context
    context.close()


def _tab(reader, site):
    """A new watched page in the reader's context."""
    return _watch(reader.new_page(), site)


@pytest.fixture
def page(reader, site):
    """A page that loads only from the local site, with its errors recorded (``_watch``)."""
    page = _tab(reader, site)
    yield page
    page.close()


def _needed(blocked: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Blocked requests that matter: anything but content images (e.g. the Colab badge picture)."""
    return [(kind, url) for kind, url in blocked if kind != "image"]


def test_other_sites_are_unreachable_and_what_a_page_asks_of_them_is_recorded(page, site):
    """The checks of ``page.blocked`` can fail: an image and fetches from other sites (by name and by
    number) never load, and each is recorded (a request to the site itself is not)."""
    page.goto(f"{site}/404.html", wait_until="load")
    outcome = page.evaluate(
        """async () => {
            const image = new Image();
            const loaded = new Promise(done => { image.onload = () => done("loaded");
                                                 image.onerror = () => done("failed"); });
            image.src = "https://example.org/picture.png";
            const fetched = await fetch("https://example.org/data.json").then(() => "loaded", () => "failed");
            const numeric = await fetch("http://192.0.2.1/data.json").then(() => "loaded", () => "failed");
            const own = await fetch("_static/logo.svg").then(r => r.ok ? "loaded" : "failed");
            return [await loaded, fetched, numeric, own];
        }"""
    )
    assert outcome == ["failed", "failed", "failed", "loaded"], outcome
    assert sorted(page.blocked) == [
        ("fetch", "http://192.0.2.1/data.json"),
        ("fetch", "https://example.org/data.json"),
        ("image", "https://example.org/picture.png"),
    ], page.blocked
    assert sorted(_needed(page.blocked)) == [
        ("fetch", "http://192.0.2.1/data.json"),
        ("fetch", "https://example.org/data.json"),
    ]


def test_math_renders_offline(page, site, tmp_path):
    page.goto(f"{site}/book/notation.html", wait_until="load")
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("() => MathJax.startup.promise")
    page.wait_for_selector("mjx-container[display='true']", timeout=20_000)
    displayed = page.locator("mjx-container[display='true']").count()
    assert displayed >= 5
    assert page.locator("mjx-merror, .MathJax_Error").count() == 0
    assert page.locator("span.eqno").count() >= 5
    assert _needed(page.blocked) == []
    assert page.errors == []
    page.screenshot(path=str(tmp_path / "notation.png"), full_page=False)


def test_search_works_offline(page, site):
    page.goto(f"{site}/search.html?q=softmax", wait_until="load")
    page.wait_for_selector("ul.search li", timeout=20_000)
    # Sphinx appends the hits one by one; wait for the notation page rather than reading the list early
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector("ul.search li a:has-text('Notation')", timeout=20_000)
    except PlaywrightTimeout:  # report what the search did find
        hits = page.locator("ul.search li a").all_inner_texts()
        raise AssertionError(
            f"searching 'softmax' did not list the notation page: {hits}"
        ) from None
    assert _needed(page.blocked) == []


def test_chapter_launch_menu_opens_the_lab_in_colab(page, site):
    page.goto(f"{site}/book/notation.html", wait_until="load")
    hrefs = page.locator("a[href*='colab.research.google.com']").evaluate_all(
        "els => els.map(e => e.href)"
    )
    assert project.colab_url("notebooks/00_notation.ipynb") in hrefs


def test_lab_page_shows_its_outputs(page, site):
    page.goto(f"{site}/notebooks/00_notation.html", wait_until="load")
    text = page.inner_text("main")
    assert "matches the reference on 3 random inputs" in text
    assert "off by a transpose" in text
    assert _needed(page.blocked) == []


_CHECK_PAGE = """() => {
    const main = document.querySelector("main") || document.body;
    const prose = main.cloneNode(true);  // the reader's text: no code, no rendered math
    prose.querySelectorAll("pre, code, mjx-container, script, style, .highlight").forEach(e => e.remove());
    const images = [...document.images].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0}));
    return {
        text: prose.innerText,
        images: images,
        mathErrors: document.querySelectorAll("mjx-merror, .MathJax_Error").length,
        overflow: document.documentElement.scrollWidth - window.innerWidth,
        copyButtons: document.querySelectorAll("button.copybtn").length,
        codeBlocks: document.querySelectorAll("div.highlight pre").length,
    };
}"""


def _visit(page, url: str) -> dict:
    page.goto(url, wait_until="load")
    page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)")
    page.evaluate("() => window.MathJax ? MathJax.startup.promise : null")
    page.wait_for_timeout(150)  # let late scripts (copy buttons, theme) finish
    return page.evaluate(_CHECK_PAGE)


@pytest.mark.parametrize("doc", sorted(PAGES, key=lambda d: d not in SLOW_FIRST))
def test_every_page_reads_offline_in_light_and_dark_mode_and_on_a_phone(reader, site, doc):
    """One visit (MathJax renders a page once), in light mode: at the width of a 390 px phone, no
    console error, every image and script from the site, math rendered with no raw LaTeX left in the
    prose, copy buttons on code, nothing wider than the screen; then at 1280 px, a chapter's core path
    within its budget; in dark mode, the figures on their light background; then axe-core's WCAG 2.1
    A/AA rules find no serious or critical violation, in dark mode and in light mode (see ``_axe``).
    In this order the page is laid out again for a new width once and switches its theme twice (on a
    2-core AMD EPYC, each costs up to 0.4 s on a long page). (That the system's dark preference selects
    dark mode is tested once, below.) Screenshots go to $COURSE_SCREENSHOTS (CI uploads them)."""
    import re

    url = f"{site}/{doc}.html"
    name = doc.replace("/", "-")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = _tab(reader, site)
    page.set_viewport_size(PHONE)
    light = _visit(page, url)  # a first visit: nothing in localStorage (``reader``)
    overflow = page.evaluate(  # what the reader must scroll sideways (scroll bars excluded)
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}-390.png"), full_page=False)
    page.set_viewport_size(DESKTOP)
    page.evaluate(_SETTLE)  # the layout for wide screens, its transitions over
    page.screenshot(path=str(SCREENSHOTS / f"{name}-1280.png"), full_page=False)
    core = page.evaluate(_CORE_PATH)
    _set_theme(page, "dark")
    backgrounds = page.evaluate(
        """() => [...document.querySelectorAll('.cell_output img')]
                 .map(i => getComputedStyle(i).backgroundColor)"""
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}-1280-dark.png"), full_page=False)
    dark_a11y = _axe(page)
    _set_theme(page, "light")
    light_a11y = _axe(page)
    errors, blocked = page.errors, page.blocked
    page.close()
    assert errors == [], errors
    assert blocked == [], blocked
    assert all(image["ok"] for image in light["images"]), light["images"]
    assert light["mathErrors"] == 0
    raw = re.findall(r"\\[a-zA-Z]+\{|\$\$|\\\(|\\\[", light["text"])
    assert raw == [], f"raw LaTeX in the text of {doc}: {raw[:5]}"
    assert light["copyButtons"] >= light["codeBlocks"] > 0 or light["codeBlocks"] == 0
    _check_core_path(doc, core)
    light_bg = [
        tuple(int(c) for c in b[b.index("(") + 1 : b.index(")")].split(",")[:3])
        for b in backgrounds
    ]
    assert all(min(rgb) >= 180 for rgb in light_bg), backgrounds  # figures keep a light background
    assert light_a11y == [], f"{doc}, light mode: " + "\n".join(light_a11y)
    assert dark_a11y == [], f"{doc}, dark mode: " + "\n".join(dark_a11y)
    assert overflow <= 1, f"{doc} is {overflow} px wider than a 390 px screen"


_SETTLE = """async () => {  // two frames for the page to react, then every finite animation's end
    await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
    const moving = document.getAnimations()
        .filter(a => a.effect && a.effect.getComputedTiming().endTime !== Infinity);
    await Promise.all(moving.map(a => a.finished.catch(() => null)));
}"""


_NO_TRANSITIONS = """() => {  // what is checked is the state after a transition, not its frames
    if (document.getElementById("tc-test-no-transitions")) return;
    const style = document.createElement("style");
    style.id = "tc-test-no-transitions";
    style.textContent = "*, *::before, *::after { transition: none !important; }";
    document.head.append(style);
}"""


def _set_theme(page, mode: str) -> None:
    """Switch the theme with CSS transitions switched off (the theme fades colours and panels over
    up to 0.4 s; axe could catch them midway, and waiting them out costs seconds a page), then let the
    page settle."""
    page.evaluate(_NO_TRANSITIONS)
    page.evaluate("mode => { document.documentElement.dataset.theme = mode; }", mode)
    page.evaluate(_SETTLE)


def test_the_systems_dark_mode_selects_the_dark_theme_and_a_later_visit_reads(browser, site):
    """With the system in dark mode the theme (mode "auto") is dark; a later visit, with the mode stored,
    reads with no console error; the math renders in both."""
    context, page = _open(browser, site, viewport=DESKTOP, color_scheme="dark")
    first = _visit(page, f"{site}/book/notation.html")
    theme = page.evaluate("() => document.documentElement.dataset.theme")
    stored = page.evaluate("() => localStorage.getItem('mode') || localStorage.getItem('theme')")
    later = _visit(page, f"{site}/book/self_attention.html")  # the mode is now in localStorage
    errors = page.errors
    context.close()
    assert theme == "dark" and stored is not None and errors == [], (theme, stored, errors)
    assert first["mathErrors"] == later["mathErrors"] == 0


_AXE_RUN = """async () => {
    const result = await axe.run(document, {
        runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
        resultTypes: ["violations"],
        preload: false,  // axe would fetch the style sheets' @imports itself, from the wrong folder
    });
    return result.violations
        .filter(v => v.impact === "serious" || v.impact === "critical")
        .map(v => `${v.impact} ${v.id} (${v.help}), ${v.nodes.length} elements, e.g. `
                  + v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(" | "));
}"""

# Highlighted code repeats a few styles thousands of times (16,000 token <span>s on Extensions), and so
# does rendered math (MathJax writes a dozen elements per symbol: 15,000 of the 20,000 elements of
# Sources). axe measures each, most of its time. The contrast of a code token depends only on its class,
# its inline style and what it sits in; a formula's on the colours it inherits or sets and what it sits
# in. So one token of each (class, style, parent, block context, folded or not) and one formula of each
# (inline or display, context, colours) stand for all; the other copies are removed (while no axe run
# has yet looked at the page: afterwards removing nodes is slow). Every style is still checked on every
# page, and the structure MathJax writes is the same for every formula.
_ONE_OF_EACH_STYLE = """() => {
    const context = (el, stop) => {  // the chain of tags and classes from el up to stop
        let where = el.closest("details:not([open])") ? "folded|" : "shown|";
        for (let e = el; e && e !== stop; e = e.parentElement) where += `${e.tagName}.${e.className}/`;
        return where;
    };
    const seen = new Set(), copies = [];
    const keep = (key, el) => { if (seen.has(key)) copies.push(el); else seen.add(key); };
    for (const pre of document.querySelectorAll(".highlight pre")) {
        const where = context(pre, document.body);
        for (const token of pre.querySelectorAll("span")) {
            if (token.firstElementChild) continue;  // a wrapper (a highlighted line): its tokens count
            const parent = token.parentElement;
            keep(`${where}${parent.tagName}.${parent.className}>${token.className}`
                 + `|${token.getAttribute("style")}`, token);
        }
    }
    for (const math of document.querySelectorAll("mjx-container")) {
        let colours = getComputedStyle(math).color;
        for (const e of math.querySelectorAll("[style*='color'], [mathcolor], [mathbackground]")) {
            colours += `|${e.getAttribute("style")}|${e.getAttribute("mathcolor")}`
                       + `|${e.getAttribute("mathbackground")}`;
        }
        keep(`math|${math.getAttribute("display")}|${context(math, document.body)}|${colours}`, math);
    }
    copies.forEach(el => el.remove());
    return copies.length;
}"""


def _axe(page) -> list[str]:
    """axe-core's serious and critical WCAG 2.1 A/AA violations on the page as it is now, code and math
    thinned out to one of each style first (``_ONE_OF_EACH_STYLE``). The script comes from the
    axe-playwright-python package: nothing is downloaded."""
    import axe_playwright_python

    if not page.evaluate("() => Boolean(window.axe)"):
        page.evaluate(_ONE_OF_EACH_STYLE)
        page.add_script_tag(
            path=str(pathlib.Path(axe_playwright_python.__file__).with_name("axe.min.js"))
        )
    return page.evaluate(_AXE_RUN)


def test_the_accessibility_check_finds_what_it_looks_for(page, site):
    """The axe runs above are not vacuous: on a page with code and math, a low-contrast paragraph, an
    image without alt text and a low-contrast code token are reported in light mode (the token although
    ``_ONE_OF_EACH_STYLE`` thinned the code out), and text that is only readable on a light background
    is reported in dark mode alone. The thinning keeps a formula in a colour of its own and removes its
    copy. (axe cannot see the contrast of MathJax's glyphs, which are CSS-generated content: a
    formula's colour is checked through the text it inherits from.)"""
    _visit(page, f"{site}/book/performance.html")  # the page itself passes (its test above)
    spans = page.locator(".highlight pre span").count()
    assert spans > 100  # code for the thinning to act on
    formulas = page.locator("mjx-container").count()
    assert formulas >= 1
    page.evaluate(
        """() => {
        const p = document.createElement("p");
        p.id = "faint-text";
        p.textContent = "faint text";
        p.style.color = "#bbbbbb";
        p.style.background = "#ffffff";
        const img = document.createElement("img");
        img.id = "no-alt";
        img.src = "../_static/logo.svg";
        const dark = document.createElement("p");
        dark.id = "dark-on-any";
        dark.textContent = "dark text on the page's background";
        dark.style.color = "#333333";
        const maths = document.createElement("p");
        for (const id of ["faint-math", "faint-math-copy"]) {
            const math = document.querySelector("mjx-container").cloneNode(true);
            math.id = id;
            math.style.color = "#dddddd";
            maths.append(math);
        }
        document.querySelector("main").prepend(p, img, maths);
        document.querySelector("main").append(dark);
        const token = document.querySelector(".highlight pre span").cloneNode();
        token.id = "faint-token";
        token.textContent = "faint_token";
        token.style.color = "#dddddd";
        document.querySelector(".highlight pre").append(token);
    }"""
    )
    light = " ".join(_axe(page))
    assert "image-alt" in light and "#faint-text" in light and "#faint-token" in light, light
    assert "#dark-on-any" not in light  # readable on the light background
    assert page.locator(".highlight pre span").count() < spans  # the code was thinned out
    assert (
        page.locator("#faint-math").count() == 1 and page.locator("#faint-math-copy").count() == 0
    )
    assert page.locator("mjx-container").count() >= 2  # the page's own formula(s) and the faint one
    page.evaluate(
        "() => ['#faint-text', '#faint-token', '#no-alt'].forEach(s => document.querySelector(s).remove())"
    )
    _set_theme(page, "dark")
    dark = _axe(page)
    assert len(dark) == 1 and "color-contrast" in dark[0] and "#dark-on-any" in dark[0], dark


def test_favicon_logo_footer_and_edit_links(page, site):
    page.goto(f"{site}/book/notation.html", wait_until="load")
    assert page.locator("link[rel='icon'][href$='favicon.svg']").count() == 1
    assert page.locator("img.logo__image").count() >= 1
    assert "MIT licence" in page.inner_text(
        "footer.bd-footer-content"
    )  # the page footer, not prev/next
    edit = page.locator("a[href*='/edit/main/book/notation.md']")
    assert edit.count() >= 1
    page.goto(f"{site}/404.html", wait_until="load")
    assert "not found" in page.inner_text("main").lower()


def test_lab_badges_are_the_sites_own_images(page, site):
    page.goto(f"{site}/notebooks/00_notation.html", wait_until="load")
    badge = page.locator("img[alt='Open In Colab']")
    assert badge.count() == 1 and badge.get_attribute("src").endswith("_static/colab-badge.svg")
    assert badge.evaluate("img => img.naturalWidth") > 0
    href = page.locator("a:has(img[alt='Open In Colab'])").get_attribute("href")
    assert href == project.colab_url("notebooks/00_notation.ipynb")


_CORE_PATH = """() => {
    // A chapter page as a reader meets it with every fold closed: the whole page, and its core path,
    // everything in the article before the section headed 'Summary' (or 'Going deeper', on a page not
    // yet split). Words: visible text outside code inputs and rendered math (cell outputs are read, so
    // they count; a check's folded detail is not visible); code: visible lines of code cells and
    // literal includes.
    const article = document.querySelector("article.bd-article") || document.querySelector("main");
    const heading = name => [...article.querySelectorAll("h2")]
        .find(h => h.textContent.replace(/^[\\d.\\s]+/, "").startsWith(name));
    const deeper = heading("Going deeper");
    const end = deeper || heading("Summary");
    const stop = end ? end.closest("section") || end : null;
    const core = el => !stop || (!stop.contains(el)
        && (stop.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_PRECEDING));
    const isCode = el => { const pre = el.closest("pre"); return pre && !pre.closest(".cell_output"); };
    const seen = {words: 0, code: 0, coreWords: 0, coreCode: 0, deeper: Boolean(deeper)};
    const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const el = walker.currentNode.parentElement;
        if (!el || el.closest("script, style, mjx-container, .MathJax, .headerlink, summary")) continue;
        if (isCode(el) || !el.checkVisibility()) continue;
        const n = (walker.currentNode.textContent.match(/[A-Za-z0-9][\\w'\u2019-]*/g) || []).length;
        seen.words += n;
        if (core(el)) seen.coreWords += n;
    }
    for (const pre of article.querySelectorAll("pre")) {
        if (pre.closest(".cell_output") || !pre.checkVisibility()) continue;
        const n = pre.innerText.split("\\n").filter(line => line.trim()).length;
        seen.code += n;
        if (core(pre)) seen.coreCode += n;
    }
    return seen;
}"""
CORE_PATH_MINUTES = 25  # prose words / 200 + visible code lines / 20
PAGE_MINUTES = 30


def _check_core_path(doc: str, seen: dict) -> None:
    """A chapter page, measured rendered with every fold closed, reads in 30 minutes and its core path
    in 25, so the budget cannot silently grow back; its *Going deeper* part is a page of its own. The
    reference pages (exercises, sources, performance, equations, citing, bibliography), the landing
    page, the *Going deeper* pages and the labs are exempt."""
    if doc not in pages.CHAPTERS:
        return
    core = seen["coreWords"] / 200 + seen["coreCode"] / 20
    assert core <= CORE_PATH_MINUTES, (
        f"{doc}: the core path reads in {core:.1f} min ({seen['coreWords']} words, "
        f"{seen['coreCode']} code lines with every fold closed) > {CORE_PATH_MINUTES}"
    )
    if doc in pages.NOT_SPLIT:
        assert seen["deeper"], f"{doc} has no 'Going deeper' section"
        return
    whole = seen["words"] / 200 + seen["code"] / 20
    assert not seen["deeper"], f"{doc}: a 'Going deeper' section on the chapter page"
    assert whole <= PAGE_MINUTES, (
        f"{doc}: the page reads in {whole:.1f} min ({seen['words']} words, {seen['code']} code "
        f"lines with every fold closed) > {PAGE_MINUTES}"
    )


# Every interactive figure of the site, by page (tests/test_book.py checks that none is missing here).
FIGURES = {
    "book/self_attention": ["attention-scale"],
    "book/language_models": ["sampling", "attention-heads"],
    "book/extensions": ["position-similarity", "kv-cache"],
    "book/training": ["schedule-adamw"],
    "book/training_deeper": ["scaling-fits"],
}

_FIGURE_STATE = """figure => ({
    live: figure.classList.contains("tc-fig--live"),
    drawing: [...figure.querySelectorAll(".tc-fig-panels svg")].map(s => s.outerHTML).join(""),
    panels: figure.querySelectorAll(".tc-fig-panels svg[role='img'][aria-label]").length,
    summary: figure.querySelector(".tc-fig-summary").textContent,
    live_region: figure.querySelector(".tc-fig-summary").getAttribute("aria-live"),
    alt: figure.querySelector("img.tc-fig-static").alt,
    controls: [...figure.querySelectorAll("[data-control]")].map(c => ({
        id: c.id, tag: c.tagName, at: Number(c.value),
        last: c.tagName === "SELECT" ? c.options.length - 1 : Number(c.max),
        label: document.querySelector(`label[for='${c.id}']`)?.textContent || "",
    })),
})"""


@pytest.mark.parametrize("doc", FIGURES)
def test_each_interactive_figure_draws_and_moves_with_the_keyboard(page, site, doc):
    """Each figure of the page replaces its static image (which keeps alt text), draws its panels with
    no console error, and every control, reached with Tab and moved with an arrow key, changes what
    is drawn and the sentence read out to screen readers. (One visit per page: its figures are
    independent of each other.)"""
    page.goto(f"{site}/{doc}.html", wait_until="load")
    for name in FIGURES[doc]:
        figure = page.locator(f"#tc-fig-{name}")
        figure.scroll_into_view_if_needed()
        state = figure.evaluate(_FIGURE_STATE)
        assert state["live"] and state["panels"] >= 1 and state["live_region"] == "polite", name
        assert len(state["alt"]) > 40 and state["summary"], (name, state)
        assert page.locator(f"#tc-fig-{name} img.tc-fig-static").is_hidden(), name
        for control in state["controls"]:
            assert control["label"], f"{name}: control {control['id']} has no label"
            before = figure.evaluate(_FIGURE_STATE)
            page.focus(f"#{control['id']}")
            page.keyboard.press("Shift+Tab")  # reach the control from the one before, as a reader
            page.keyboard.press("Tab")
            assert page.evaluate("() => document.activeElement.id") == control["id"], name
            page.keyboard.press("ArrowLeft" if control["at"] == control["last"] else "ArrowRight")
            after = figure.evaluate(_FIGURE_STATE)
            moved = next(c for c in after["controls"] if c["id"] == control["id"])
            assert moved["at"] != control["at"], f"{name}: the key did not move {control['id']}"
            assert after["drawing"] != before["drawing"], (
                f"{name}: {control['id']} changed nothing drawn"
            )
            assert after["summary"] != before["summary"], (
                f"{name}: {control['id']} left the sentence"
            )
    assert page.errors == [] and _needed(page.blocked) == [], page.errors


def test_the_kv_cache_calculator_agrees_with_the_package_and_the_measured_caches(page, site):
    """The calculator computes in the browser; at 30 random settings it gives the package's
    kv_cache_bytes, and at its opening setting it names the cache measured on the page."""
    import json
    import random

    import torch

    from transformer_course import extensions

    page.goto(f"{site}/book/extensions.html", wait_until="load")
    figure = page.locator("#tc-fig-kv-cache")
    spec = json.loads(figure.locator("script.tc-fig-data").text_content())
    assert "measured 32,768 bytes" in figure.locator(".tc-fig-summary").text_content()
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    rng = random.Random(0)
    for _ in range(30):
        chosen = {c["name"]: rng.randrange(len(c["values"])) for c in spec["controls"]}
        figure.evaluate(
            """(figure, chosen) => { for (const [name, i] of Object.entries(chosen)) {
                const input = figure.querySelector(`[data-control='${name}']`);
                input.value = String(i); input.dispatchEvent(new Event("input")); } }""",
            chosen,
        )
        v = {c["name"]: c["values"][chosen[c["name"]]] for c in spec["controls"]}
        expected = extensions.kv_cache_bytes(
            v["layers"], v["batch"], min(v["kv_heads"], v["heads"]), v["context"], v["d_head"],
            dtypes[v["dtype"]],
        )  # fmt: skip
        assert int(figure.get_attribute("data-value")) == expected, v
        assert f"{expected:,} bytes" in figure.locator(".tc-fig-summary").text_content()
    assert page.errors == [], page.errors


class _NotFoundHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site under a prefix, and its 404 page (status 404) for any missing path, as GitHub
    Pages does."""

    prefix = "/"

    def log_message(self, *args: object) -> None:
        pass

    def send_head(self):
        if not self.path.startswith(self.prefix):
            return self._not_found()
        self.path = "/" + self.path[len(self.prefix) :]
        local = pathlib.Path(self.translate_path(self.path))
        if not local.exists():
            return self._not_found()
        return super().send_head()

    def _not_found(self):
        body = (pathlib.Path(self.directory) / "404.html").read_bytes()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        import io

        return io.BytesIO(body)


@pytest.mark.parametrize("prefix", ["/transformer-course/", "/", "/a/mirror/"])
def test_the_404_page_is_styled_from_any_prefix(browser, built_book, prefix):
    """At a missing URL under the published prefix (at any depth), at the root and under another
    prefix, the 404 page loads its styles, scripts and logo with no console error and links home."""
    handler = functools.partial(_NotFoundHandler, directory=str(built_book))
    handler.func.prefix = prefix
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    # one reader for the missing pages: an asset from a wrong path is another URL, never a cached one
    context = browser.new_context()
    try:
        # any depth under the published prefix; elsewhere the root is found from the course's own
        # folders (book/, notebooks/, _static/) or the top level (a deeper unknown path cannot say
        # where the site starts)
        deep = ["a/b/c/"] if prefix == "/transformer-course/" else []
        for missing in ["no-such-page.html", "book/no-such-page.html", "notebooks/x/y.html", *deep]:
            page = _watch(context.new_page(), origin)
            target = f"{origin}{prefix}{missing}"
            response = page.goto(target, wait_until="load")
            assert response.status == 404
            styled = page.evaluate(
                """() => ({
                    sheets: [...document.styleSheets].filter(s => s.href && s.cssRules.length).length,
                    links: document.querySelectorAll("link[rel=stylesheet]").length,
                    scripts: typeof DOCUMENTATION_OPTIONS === "object" && typeof Search === "object",
                    logo: [...document.images].filter(i => i.classList.contains("logo__image"))
                          .every(i => i.complete && i.naturalWidth > 0),
                    home: document.querySelector("a.navbar-brand")?.href,
                })"""
            )
            errors = [
                e for e in page.errors if not ("status of 404" in e and e.endswith(f"({target})"))
            ]
            page.close()
            assert styled["sheets"] == styled["links"] >= 5, (prefix, missing, styled)
            assert styled["logo"] and styled["scripts"], (prefix, missing, styled)
            assert styled["home"].startswith(f"{origin}{prefix}"), styled["home"]
            assert errors == [], (prefix, missing, errors)
    finally:
        context.close()
        server.shutdown()


def test_the_404_page_opens_from_a_folder(browser, built_book):
    context, page = _open(browser, "file://")
    page.goto((built_book / "404.html").as_uri(), wait_until="load")
    sheets = page.evaluate("() => [...document.styleSheets].filter(s => s.href).length")
    logo = page.evaluate(
        "() => [...document.images].filter(i => i.classList.contains('logo__image'))"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )
    context.close()
    assert sheets >= 5 and logo
