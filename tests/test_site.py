"""The built site as readers meet it: every page in a real browser, on a desktop and a phone.

Serves ``_build/html`` on 127.0.0.1 and opens every page in Debian's Chromium (driven by
Playwright) at 1280 px and at 400 px. A page fails on any console or page error, on a request
that fails, on horizontal overflow at 400 px, on an image that does not load or has no alt text
(a file name is none), on a raster image shown larger than 1/1.5 of its natural width (blurry on
a hi-DPI screen), on an internal link or
``#anchor`` that leads nowhere, and on raw ANSI escapes or a Python traceback in its text.
Screenshots of every page at both widths go to ``_build/screenshots/`` for review.

Not part of the quick suite (marker ``site``): run it after a build with ``pytest -m site -n0``.
Needs a built site: ``jupyter-book build book/``. Without one, or without Playwright or
Chromium, the test skips with one line of reason, except where ``SPMD_SITE_TEST=1`` (set by
``.ci/run``) makes a skip a failure.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = os.environ.get("SPMD_CHROMIUM", "/usr/bin/chromium")
WIDTHS = (1280, 400)
PHONE = 400
#: A raster image must have at least this many pixels per displayed CSS pixel.
MIN_DENSITY = 1.5
# Connections out are refused here: no sandbox, no GPU, nothing phoning home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Raw escape codes (ESC[...m), or their printable remains, and Python tracebacks.
pytestmark = pytest.mark.site

ANSI = re.compile(r"\x1b\[|\[(?:\d{1,3};)*\d{1,3}m(?=[\w\s])")
TRACEBACK = "Traceback (most recent call last)"

# What the page reports about itself, measured in the browser.
MEASURE = """(phone) => {
  const doc = document.documentElement;
  const wide = [];
  if (phone && doc.scrollWidth > window.innerWidth) {
    for (const el of document.body.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.right > window.innerWidth + 1 && r.width > 0) {
        let clipped = false;  // inside a box that scrolls or clips: not the page's overflow
        for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
          const s = getComputedStyle(p);
          if (['auto', 'scroll', 'hidden', 'clip'].includes(s.overflowX)) { clipped = true; break; }
        }
        if (!clipped) wide.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
          (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : '') +
          ' ' + Math.round(r.right) + 'px');
      }
    }
  }
  const images = [...document.images].filter(img => img.getClientRects().length).map(img => ({
    src: img.currentSrc || img.src, complete: img.complete, natural: img.naturalWidth,
    shown: img.getBoundingClientRect().width, alt: img.getAttribute('alt')}));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  const ids = [...document.querySelectorAll('[id]')].map(el => el.id)
    .concat([...document.querySelectorAll('a[name]')].map(a => a.name));
  return {scrollWidth: doc.scrollWidth, width: window.innerWidth, wide: wide.slice(0, 5),
          images, links, ids, text: document.body.innerText};
}"""


def _site_or_skip() -> Path:
    """The built site; a skip (or, under SPMD_SITE_TEST=1, a failure) when it cannot be tested."""
    required = os.environ.get("SPMD_SITE_TEST") == "1"
    problem = None
    if not (SITE / "index.html").exists():
        problem = f"no built site at {SITE} (run: jupyter-book build book/)"
    elif not Path(CHROMIUM).exists():
        problem = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed (pip install -e '.[test]')"
    if problem:
        if required:
            pytest.fail(f"SPMD_SITE_TEST=1 but {problem}")
        pytest.skip(problem)
    return SITE


REDIRECT = re.compile(r'http-equiv="refresh" content="\d+;\s*url=([^"]+)"', re.I)


def _pages(site: Path) -> tuple[list[str], dict[str, str]]:
    """Every HTML page of the site (paths relative to its root), and the redirect stubs
    (such as ``index.html``) with where they send the reader."""
    skip = ("_static/", "_sources/", "_images/", "_downloads/")
    pages, redirects = [], {}
    for path in sorted(site.rglob("*.html")):
        name = path.relative_to(site).as_posix()
        if name.startswith(skip):
            continue
        stub = REDIRECT.search(path.read_text(errors="replace")[:2000])
        if stub:
            redirects[name] = stub.group(1)
        else:
            pages.append(name)
    return pages, redirects


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    site = _site_or_skip()
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield site, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _visit(browser, base: str, pages: list[str], width: int,
           problems: dict[str, list[str]], seen: dict[str, dict]) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900},
                                  service_workers="block")
    page = context.new_page()
    current = {"name": ""}

    def note(kind: str, text: str) -> None:
        problems[kind].append(f"{current['name']} @{width}px: {text}")

    page.on("console", lambda msg: msg.type == "error" and note("console error", msg.text))
    page.on("pageerror", lambda error: note("page error", str(error)))
    page.on("requestfailed", lambda req: note("failed request",
                                              f"{req.url} ({req.failure})"))
    page.on("response", lambda resp: resp.status >= 400
            and note("failed request", f"{resp.url} (HTTP {resp.status})"))
    for name in pages:
        current["name"] = name
        page.goto(base + name, wait_until="load")
        facts = page.evaluate(MEASURE, width == PHONE)
        if width == PHONE and facts["scrollWidth"] > facts["width"]:
            note("wider than a phone",
                 f"{facts['scrollWidth']} px: {', '.join(facts['wide']) or '?'}")
        for image in facts["images"]:
            if not image["complete"] or image["natural"] == 0:
                note("image not loaded", image["src"])
            elif (not image["src"].split("?")[0].endswith(".svg")
                  and not image["src"].startswith("data:image/svg")
                  and image["natural"] < MIN_DENSITY * image["shown"] - 0.5):
                note("blurry raster image",
                     f"{image['src']}: {image['natural']} px shown at {image['shown']:.0f} px")
            alt = (image["alt"] or "").strip()
            if not alt or re.search(r"\.(png|svg|jpe?g|gif)$", alt):  # none, or a file name
                note("image without alt text", image["src"][:120])
        if ANSI.search(facts["text"]):
            note("raw ANSI escapes", ANSI.search(facts["text"]).group(0))
        if TRACEBACK in facts["text"]:
            note("traceback in page", TRACEBACK)
        seen.setdefault(name, facts)
        shot = SHOTS / f"{name.removesuffix('.html').replace('/', '__')}-{width}.jpg"
        page.screenshot(path=str(shot), full_page=True, type="jpeg", quality=80)
    context.close()


def _visit_in_own_browser(*args: object) -> None:
    """One width in its own Playwright and Chromium (one per thread): the two widths run at
    once, using both cores."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            _visit(browser, *args)
        finally:
            browser.close()


def _check_links(site: Path, base: str, seen: dict[str, dict],
                 problems: dict[str, list[str]]) -> None:
    ids = {name: set(facts["ids"]) for name, facts in seen.items()}
    for name, facts in seen.items():
        for href in set(facts["links"]):
            if not href.startswith(base):
                continue  # external: not followed here (there is no network)
            parts = urlsplit(href)
            target = unquote(parts.path)[len(urlsplit(base).path):] or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not (site / target).is_file():
                problems["broken link"].append(f"{name}: {href} (no {target})")
            elif parts.fragment and target in ids and unquote(parts.fragment) not in ids[target]:
                problems["broken anchor"].append(f"{name}: {href}")


def test_every_page_in_a_browser(server):
    site, base = server
    pages, redirects = _pages(site)
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    problems: dict[str, list[str]] = defaultdict(list)
    seen: dict[str, dict] = {}
    errors: list[BaseException] = []

    def run(width: int) -> None:
        try:
            _visit_in_own_browser(base, pages, width, problems, seen)
        except BaseException as error:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(width,)) for width in WIDTHS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    _check_links(site, base, seen, problems)
    for name, target in redirects.items():
        if not (site / Path(name).parent / target).is_file():
            problems["broken link"].append(f"{name}: redirects to missing {target}")
    counts = {kind: len(found) for kind, found in sorted(problems.items())}
    (SHOTS / "report.json").write_text(json.dumps(
        {"pages": len(pages), "counts": counts, "problems": problems}, indent=1))
    assert len(pages) > 1
    assert not problems, f"{len(pages)} pages; problems: {counts}\n" + "\n".join(
        f"[{kind}] {item}" for kind, found in sorted(problems.items()) for item in found[:8])
