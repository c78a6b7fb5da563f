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

from transformer_course import project

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


@pytest.fixture
def page(browser, site):
    """A page whose requests outside the local site are blocked and recorded."""
    context = browser.new_context()
    page = context.new_page()
    page.blocked = []
    page.errors = []

    def route(r):
        if r.request.url.startswith(site):
            return r.continue_()
        page.blocked.append((r.request.resource_type, r.request.url))
        return r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda err: page.errors.append(str(err)))
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
