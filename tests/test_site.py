"""The built site in a real headless browser, with the network cut off: it must read offline.

Uses Debian's chromium (``/usr/bin/chromium``, or ``$CHROMIUM``) driven by Playwright; no browser is
downloaded. Without chromium these tests are skipped, unless ``COURSE_REQUIRE_BROWSER=1`` (set by CI),
in which case they fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import shutil
import threading
from collections.abc import Iterator

import pytest
import yaml

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = [TOC["root"]] + [c["file"] for part in TOC["parts"] for c in part["chapters"]]
SCREENSHOTS = pathlib.Path(os.environ.get("COURSE_SCREENSHOTS", ROOT / "_build" / "screenshots"))

pytestmark = pytest.mark.site
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


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


@pytest.fixture(scope="module")
def browser():
    if not (pathlib.Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        message = f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set $CHROMIUM)"
        if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _open(browser, site, **context_options):
    """A page in a new context whose requests outside the local site are blocked and recorded, and
    whose JavaScript errors and console errors are recorded."""
    context = browser.new_context(**context_options)
    page = context.new_page()
    page.blocked, page.errors = [], []

    def route(r):
        if r.request.url.startswith(site):
            return r.continue_()
        page.blocked.append((r.request.resource_type, r.request.url))
        return r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda err: page.errors.append(f"page error: {err}"))
    page.on(
        "console",
        lambda msg: (
            page.errors.append(f"console {msg.type}: {msg.text}")
            if msg.type in ("error", "warning") and "[PST]" not in msg.text
            else None
        ),
    )
    page.on(
        "requestfailed",
        lambda r: (
            page.errors.append(f"failed request: {r.url}") if r.url.startswith(site) else None
        ),
    )
    return context, page


@pytest.fixture
def page(browser, site):
    """A page whose requests outside the local site are blocked and recorded."""
    context, page = _open(browser, site)
    yield page
    context.close()


def _needed(blocked: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Blocked requests that matter: anything but content images (e.g. the Colab badge picture)."""
    return [(kind, url) for kind, url in blocked if kind != "image"]


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


@pytest.mark.parametrize("doc", PAGES)
def test_every_page_reads_offline_in_light_and_dark_mode_and_on_a_phone(browser, site, doc):
    """First visit, later visit and dark mode at 1280 px, then a 390 px phone: no console error, every
    image and script from the site, math rendered with no raw LaTeX left in the prose, copy buttons on
    code, nothing wider than the screen. Screenshots go to $COURSE_SCREENSHOTS (CI uploads them)."""
    import re

    url = f"{site}/{doc}.html"
    name = doc.replace("/", "-")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context, page = _open(browser, site, viewport={"width": 1280, "height": 900})
    first = _visit(page, url)  # a first visit: nothing in localStorage yet
    later = _visit(page, url)  # a later visit: the theme mode is stored
    page.screenshot(path=str(SCREENSHOTS / f"{name}-1280.png"), full_page=False)
    errors, blocked = page.errors, page.blocked
    context.close()
    assert errors == [], errors
    assert blocked == [], blocked
    for result in (first, later):
        assert all(image["ok"] for image in result["images"]), result["images"]
        assert result["mathErrors"] == 0
        raw = re.findall(r"\\[a-zA-Z]+\{|\$\$|\\\(|\\\[", result["text"])
        assert raw == [], f"raw LaTeX in the text of {doc}: {raw[:5]}"
        assert result["copyButtons"] >= result["codeBlocks"] > 0 or result["codeBlocks"] == 0

    context, page = _open(
        browser, site, viewport={"width": 1280, "height": 900}, color_scheme="dark"
    )
    dark = _visit(page, url)
    theme = page.evaluate("() => document.documentElement.dataset.theme")
    backgrounds = page.evaluate(
        """() => [...document.querySelectorAll('.cell_output img')]
                 .map(i => getComputedStyle(i).backgroundColor)"""
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}-1280-dark.png"), full_page=False)
    errors = page.errors
    context.close()
    assert theme == "dark" and errors == [], errors
    light = [
        tuple(int(c) for c in b[b.index("(") + 1 : b.index(")")].split(",")[:3])
        for b in backgrounds
    ]
    assert all(min(rgb) >= 180 for rgb in light), backgrounds  # figures keep a light background
    assert dark["mathErrors"] == 0

    context, page = _open(browser, site, viewport={"width": 390, "height": 844}, is_mobile=True)
    phone = _visit(page, url)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-390.png"), full_page=False)
    errors = page.errors
    context.close()
    assert errors == [], errors
    assert phone["overflow"] <= 1, f"{doc} is {phone['overflow']} px wider than a 390 px screen"


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
    // The core path of a chapter as a reader meets it with every fold closed: everything in the article
    // before the section headed 'Going deeper'. Words: visible text outside code inputs and rendered
    // math (cell outputs, such as the checks' verdict lines, are read, so they count); code: visible
    // lines of code cells and literal includes.
    const article = document.querySelector("article.bd-article") || document.querySelector("main");
    const deeper = [...article.querySelectorAll("h2")]
        .find(h => h.textContent.replace(/^[\\d.\\s]+/, "").startsWith("Going deeper"));
    const stop = deeper ? deeper.closest("section") || deeper : null;
    const core = el => !stop || (!stop.contains(el)
        && (stop.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_PRECEDING));
    const isCode = el => { const pre = el.closest("pre"); return pre && !pre.closest(".cell_output"); };
    let words = 0, code = 0;
    const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const el = walker.currentNode.parentElement;
        if (!el || el.closest("script, style, mjx-container, .MathJax, .headerlink, summary")) continue;
        if (isCode(el) || !el.checkVisibility() || !core(el)) continue;
        words += (walker.currentNode.textContent.match(/[A-Za-z0-9][\\w'\u2019-]*/g) || []).length;
    }
    for (const pre of article.querySelectorAll("pre")) {
        if (pre.closest(".cell_output") || !pre.checkVisibility() || !core(pre)) continue;
        code += pre.innerText.split("\\n").filter(line => line.trim()).length;
    }
    return {words, code, deeper: Boolean(deeper)};
}"""
CORE_PATH_MINUTES = 25  # prose words / 200 + visible code lines / 20


@pytest.mark.parametrize("doc", [p for p in PAGES if p.startswith("book/")])
def test_each_chapters_core_path_reads_in_25_minutes(page, site, doc):
    """Measured on the rendered page with every fold closed, so the budget cannot silently grow back.
    The reference pages (exercises, sources, performance, equations, citing, bibliography) and the
    landing page are exempt."""
    import pages as source_pages

    if doc not in source_pages.CHAPTERS:
        pytest.skip("a reference page: no reading budget")
    page.goto(f"{site}/{doc}.html", wait_until="load")
    seen = page.evaluate(_CORE_PATH)
    minutes = seen["words"] / 200 + seen["code"] / 20
    assert seen["deeper"], f"{doc} has no 'Going deeper' section"
    assert minutes <= CORE_PATH_MINUTES, (
        f"{doc}: the core path reads in {minutes:.1f} min ({seen['words']} words, {seen['code']} "
        f"code lines with every fold closed) > {CORE_PATH_MINUTES}"
    )
