"""
The built docs render for a reader: no page wider than the window, no raw Markdown, no broken image.

The build itself runs with warnings as errors, which catches broken references and includes but
not what a browser shows: a Markdown table included as a literal block renders as ``| a | b |``
text, and a wide table or code block in a fixed-width theme pushes the page sideways on a phone.
Each page is opened in headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright)
at a desktop width and a phone width. A browser that cannot start fails the test: a skipped
check would look like a passing one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
WIDTHS = {"desktop": 1280, "phone": 390}
PAGES_NOT_CHECKED = {"search.html"}
"""Sphinx's search page is filled by JavaScript from a query; it has no content of its own."""

PAGE_PROBLEMS = """
() => {
  const root = document.documentElement;
  const problems = [];
  const TABLE_ROW = /^\\s*\\|[^|]+\\|/;  // a Markdown table row: | cell | ...  (not a lone separator)
  if (root.scrollWidth > root.clientWidth) {
    const wide = [...document.querySelectorAll('body *')]
      .filter(e => e.getBoundingClientRect().right > root.clientWidth + 1)
      .filter(e => !e.closest('pre, table, div.highlight'))
      .slice(0, 3)
      .map(e => e.tagName.toLowerCase() + '.' + [...e.classList].join('.'));
    problems.push(`page ${root.scrollWidth}px wide in a ${root.clientWidth}px window (${wide.join(', ')})`);
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest('pre, script, style')) continue;
    for (const line of node.textContent.split('\\n')) {
      if (TABLE_ROW.test(line)) {
        problems.push(`raw Markdown outside a code block: ${line.trim().slice(0, 60)}`);
      }
    }
  }
  for (const block of document.querySelectorAll('div.highlight-markdown, div.highlight-md')) {
    const first = block.innerText.split('\\n').find(line => TABLE_ROW.test(line));
    if (first) problems.push(`a Markdown table shown as code: ${first.trim().slice(0, 60)}`);
  }
  for (const img of document.images) {
    const src = img.getAttribute('src');
    if (!img.complete || img.naturalWidth === 0) problems.push(`image did not load: ${src}`);
    else if (img.getBoundingClientRect().width > root.clientWidth) {
      problems.push(`image wider than the window: ${src}`);
    }
  }
  return problems;
}
"""


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs as HTML: the build scripts/test.sh made (SHARED_STREAM_DOCS_HTML), else one made here."""
    built = os.environ.get("SHARED_STREAM_DOCS_HTML")
    if built and (Path(built) / "index.html").exists():
        return Path(built)
    out = tmp_path_factory.mktemp("docs-html")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"the docs build failed:\n{result.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, or a failure that says why it did not start (never a skip)."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/bootstrap.sh installs Debian's chromium package")
    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        except Exception as exc:
            pytest.fail(f"Chromium ({CHROMIUM}) did not start: {exc}")
        yield chromium
        chromium.close()


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.glob("*.html") if p.name not in PAGES_NOT_CHECKED)


@pytest.mark.parametrize("width", WIDTHS.values(), ids=WIDTHS.keys())
def test_every_page_fits_the_window_shows_no_raw_markdown_and_loads_its_images(
    html: Path, browser: Any, width: int
) -> None:
    pages = _pages(html)
    assert len(pages) > 20, f"only {len(pages)} pages in {html}"
    context = browser.new_context(viewport={"width": width, "height": 900})
    found: dict[str, list[str]] = {}
    try:
        page = context.new_page()
        for path in pages:
            page.goto(path.as_uri(), wait_until="load")
            problems = page.evaluate(PAGE_PROBLEMS)
            if problems:
                found[path.name] = problems
    finally:
        context.close()
    assert found == {}, "\n".join(f"{name} at {width}px: {'; '.join(p)}" for name, p in found.items())


def test_a_markdown_table_included_as_a_literal_block_is_caught(browser: Any, tmp_path: Path) -> None:
    """The check itself: the raw-Markdown rendering it exists for, and a page wider than a phone."""
    page_html = tmp_path / "page.html"
    page_html.write_text(
        "<html><body><div class='highlight-markdown'><pre>| a | b |\n| --- | --- |</pre></div>"
        "<p>| a | b |\n| --- | --- |</p><table><tr><td style='white-space: nowrap'>"
        + "x" * 400
        + "</td></tr></table><img src='missing.png'></body></html>"
    )
    context = browser.new_context(viewport={"width": WIDTHS["phone"], "height": 900})
    try:
        page = context.new_page()
        page.goto(page_html.as_uri(), wait_until="load")
        problems = page.evaluate(PAGE_PROBLEMS)
    finally:
        context.close()
    assert any(p.startswith("page ") for p in problems), problems
    assert any(p.startswith("raw Markdown outside a code block") for p in problems), problems
    assert any(p.startswith("a Markdown table shown as code") for p in problems), problems
    assert any(p.startswith("image did not load: missing.png") for p in problems), problems


def test_the_configuration_page_has_every_option_of_provider_yaml(html: Path) -> None:
    import yaml

    config = yaml.safe_load((ROOT / "provider.yaml").read_text())["config"]
    page = (html / "configuration.html").read_text()
    for section, spec in config.items():
        for name in spec["options"]:
            assert f'id="confval-{section}-{name}"' in page, f"[{section}] {name} is not in the reference"
