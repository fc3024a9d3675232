"""The HTML book as a reader sees it: every page opened in a real, headless Chromium.

README's setup command builds the book into ``_build/html`` (``$BOOK_HTML`` points elsewhere).
These tests serve that folder on 127.0.0.1, open every page of ``_toc.yml`` in headless
Chromium driven by selenium (with the installed ``chromedriver``: nothing is downloaded; every
host but 127.0.0.1 is unreachable for the browser, as on a reader's machine without internet)
and check what the reader gets:

* the page loads with no JavaScript error (a blocked external resource is tolerated);
* the left navigation lists every chapter, in ``_toc.yml``'s order;
* every image has loaded (``naturalWidth > 0``);
* no cell output shows a traceback, except in cells tagged ``raises-exception``, and no output
  shows the build machine's absolute path of the repository;
* every internal link resolves (HTTP 200, and the ``#anchor`` exists on the target page);
* each chapter has a Colab launch link to its own notebook;
* the exercise solutions (``<details class="solution">``) are there and collapsed;
* every ``{glue}`` number is rendered, and no role is left as literal text;
* every formula is typeset by MathJax (served from the book itself), with no raw TeX left.

A full-page screenshot of each page goes to ``_build/screenshots/`` (``$BOOK_SCREENSHOTS``).
The tests are skipped, with the reason, only when no Chromium or chromedriver is installed
(``.ci/run`` installs Debian's ``chromium`` and ``chromium-driver`` when it can).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "_build" / "screenshots"))
COLAB = "https://colab.research.google.com/github/"
#: Tallest screenshot taken, in CSS pixels (a longer page is cut there).
MAX_SCREENSHOT_HEIGHT = 16_000


# ---------------------------------------------------------------------------------------------
# The pages: _toc.yml in reading order
# ---------------------------------------------------------------------------------------------


def toc_files() -> list[str]:
    """Every document of ``_toc.yml`` in reading order (root first), without extension."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            if "file" in entry:
                files.append(entry["file"])
            for key in ("chapters", "sections"):
                walk(entry.get(key, []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    walk(toc.get("chapters", []))
    return files


def source_of(page: str) -> Path:
    """The source file of a page: ``book/05_masking`` → ``book/05_masking.ipynb`` (or ``.md``)."""
    for suffix in (".ipynb", ".md"):
        if (ROOT / f"{page}{suffix}").is_file():
            return ROOT / f"{page}{suffix}"
    raise FileNotFoundError(f"_toc.yml names {page!r}, but no {page}.ipynb or {page}.md exists")


def markdown_of(page: str) -> str:
    """The markdown a page is written in (a notebook's markdown cells, joined)."""
    source = source_of(page)
    text = source.read_text(encoding="utf-8")
    if source.suffix != ".ipynb":
        return text
    cells = json.loads(text)["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


PAGES = toc_files()
CHAPTERS = [page for page in PAGES if source_of(page).suffix == ".ipynb"]
GLUE_TEXT_ROLE = re.compile(r"\{glue:text\}`")


# ---------------------------------------------------------------------------------------------
# The browser and the server
# ---------------------------------------------------------------------------------------------


def find_browser() -> tuple[str, str] | None:
    """``(chromium, chromedriver)`` paths, from ``$CHROME``/``$CHROMEDRIVER`` or the PATH
    (or, on GitHub's runners, the driver folder ``$CHROMEWEBDRIVER``)."""
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    chrome = os.environ.get("CHROME") or next(filter(None, map(shutil.which, names)), None)
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if driver is None and os.environ.get("CHROMEWEBDRIVER"):
        driver = shutil.which("chromedriver", path=os.environ["CHROMEWEBDRIVER"])
    return (chrome, driver) if chrome and driver else None


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves the built book without logging every request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """The built book served on 127.0.0.1 at a free port; yields the base URL."""
    if not (HTML / "index.html").is_file():
        pytest.fail(
            f"no built book at {HTML} (index.html missing): run README's setup command first, "
            "which builds it with `jupyter-book build`, or point $BOOK_HTML at a built book"
        )
    handler = functools.partial(QuietHandler, directory=str(HTML))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


# Collects uncaught errors and rejected promises from the first line of every page on.
CATCH_ERRORS = """
window.__bookErrors = [];
window.addEventListener('error', e => window.__bookErrors.push(
  e.message ? 'uncaught ' + e.message + (e.filename ? ' at ' + e.filename + ':' + e.lineno : '')
  : 'Failed to load resource: ' + ((e.target && (e.target.src || e.target.href)) || '?')), true);
window.addEventListener('unhandledrejection', e => window.__bookErrors.push(
  'unhandled rejection: ' + (e.reason && (e.reason.stack || e.reason.message) || e.reason)));
"""

# Everything the checks need from one page, read in the browser after MathJax has finished.
READ_PAGE = """
const root = arguments[0];
const outputs = [...document.querySelectorAll('.cell_output')];
const prose = document.querySelector('article') || document.body;
const clone = prose.cloneNode(true);
clone.querySelectorAll('pre, code, script, style, mjx-container, .cell_output, .cell_input')
  .forEach(node => node.remove());
return {
  errors: window.__bookErrors || [],
  mathjax: (window.MathJax && MathJax.version) || null,  // null: the MathJax script never ran
  nav: [...document.querySelectorAll('nav.bd-docs-nav a.reference.internal')].map(a => a.href),
  images: [...document.images].map(img => ({
    src: img.currentSrc || img.src, complete: img.complete, width: img.naturalWidth})),
  tracebacks: outputs
    .filter(o => !o.closest('.tag_raises-exception'))
    .filter(o => o.querySelector('.traceback') ||
                 o.textContent.includes('Traceback (most recent call last)'))
    .map(o => o.textContent.trim().slice(0, 300)),
  paths: outputs.filter(o => o.textContent.includes(root))
    .map(o => o.textContent.trim().slice(0, 300)),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  colab: [...document.querySelectorAll('a[href^="https://colab.research.google.com/"]')]
    .map(a => a.href),
  solutions: [...document.querySelectorAll('details.solution')].map(d => ({
    open: d.open,
    summary: (d.querySelector('summary') || {textContent: ''}).textContent.trim(),
    hidden: [...d.children].filter(c => c.tagName !== 'SUMMARY')
      .every(c => !c.checkVisibility())})),
  glued: document.querySelectorAll('.pasted-text').length,
  math: [...document.querySelectorAll('.math')].map(m => ({
    rendered: m.querySelector('mjx-container') !== null,
    text: m.textContent.trim().slice(0, 80)})),
  prose: clone.textContent,
};
"""


@dataclass
class Page:
    """What a reader got on one page."""

    url: str
    seconds: float
    console: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def tolerated(message: str, origin: str) -> bool:
    """Whether an error is a blocked external resource (the browser has no internet) or the
    browser's own request for a ``/favicon.ico`` the book does not have."""
    urls = re.findall(r"https?://[^\s'\"]+", message)
    failed_load = "Failed to load resource" in message or "net::ERR_" in message
    external = bool(urls) and all(not url.startswith(origin) for url in urls)
    favicon = bool(urls) and all(url == f"{origin}/favicon.ico" for url in urls)
    return failed_load and (external or favicon)


@pytest.fixture(scope="module")
def pages(site: str) -> dict[str, Page]:
    """Every page of the book opened once in headless Chromium (and its screenshot saved)."""
    browser = find_browser()
    if browser is None:
        pytest.skip(
            "no Chromium/chromedriver installed (looked for chromium, chromium-browser, "
            "google-chrome and chromedriver on the PATH, or $CHROME/$CHROMEDRIVER): "
            "install Debian's `chromium` and `chromium-driver` to run the browser test"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome, chromedriver = browser
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--no-first-run",
        # a reader without internet: every host except the book's server is unreachable
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Page] = {}
    try:
        driver.set_page_load_timeout(120)
        driver.set_script_timeout(60)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CATCH_ERRORS})
        for page in PAGES:
            start = time.perf_counter()
            url = urllib.parse.urljoin(site, f"{page}.html")
            driver.get(url)
            # MathJax typesets after the load event: wait for it (when the page loaded it)
            driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "if (window.MathJax && MathJax.startup && MathJax.startup.promise) {"
                "  MathJax.startup.promise.then(() => done(true), () => done(false));"
                "} else { done(null); }"
            )
            data = driver.execute_script(READ_PAGE, str(ROOT))
            # errors of the page and failed requests; a library's console.error is no error
            console = [
                entry["message"]
                for entry in driver.get_log("browser")
                if entry["level"] == "SEVERE" and entry.get("source") != "console-api"
            ]
            screenshot(driver, SCREENSHOTS / f"{page.replace('/', '__')}.png")
            results[page] = Page(url, time.perf_counter() - start, console, data)
    finally:
        driver.quit()
    return results


def screenshot(driver: Any, path: Path) -> None:
    """A full-page PNG of the open page (at most :data:`MAX_SCREENSHOT_HEIGHT` pixels tall)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "scale": 1}
    clip["height"] = min(size["height"], MAX_SCREENSHOT_HEIGHT)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


# ---------------------------------------------------------------------------------------------
# Internal links: fetched once each, anchors looked up in the target's HTML
# ---------------------------------------------------------------------------------------------


@functools.cache
def fetch(url: str) -> tuple[int, frozenset[str]]:
    """HTTP status of ``url`` and, for an HTML page, the ids and names its elements carry."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (127.0.0.1 only)
            status, body = response.status, response.read()
            html = "text/html" in response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, frozenset()
    if not html:
        return status, frozenset()
    text = body.decode("utf-8", errors="replace")
    anchors = re.findall(r"""\s(?:id|name)=["']([^"']+)["']""", text)
    return status, frozenset(urllib.parse.unquote(a) for a in anchors)


# ---------------------------------------------------------------------------------------------
# The checks, one test per page and check
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_without_javascript_errors(pages: dict[str, Page], site: str, page: str):
    """No uncaught error, no failed request to the book's own server; blocked CDNs tolerated."""
    result = pages[page]
    status, _ = fetch(result.url)
    assert status == 200, f"{page}: {result.url} answers HTTP {status} (not in the build?)"
    errors = [
        message
        for message in result.console + result.data["errors"]
        if not tolerated(message, site.rstrip("/"))
    ]
    assert not errors, f"{page}: JavaScript errors in the browser:\n" + "\n".join(errors)
    assert (SCREENSHOTS / f"{page.replace('/', '__')}.png").stat().st_size > 0


@pytest.mark.parametrize("page", PAGES)
def test_navigation_lists_every_chapter_in_order(pages: dict[str, Page], site: str, page: str):
    """The left navigation names every document of ``_toc.yml`` after the root, in order."""
    listed = []
    for href in pages[page].data["nav"]:
        path = urllib.parse.urlsplit(href).path.lstrip("/")
        if path.endswith(".html"):
            listed.append(path.removesuffix(".html"))
    expected = PAGES[1:]
    in_nav = [p for p in listed if p in expected]
    assert in_nav == expected, (
        f"{page}: the navigation lists {in_nav}, expected every chapter in _toc.yml's order "
        f"{expected}"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_image_loaded(pages: dict[str, Page], page: str):
    """Every ``<img>`` has finished loading with a real picture (``naturalWidth > 0``)."""
    broken = [img["src"] for img in pages[page].data["images"] if not img["width"]]
    assert not broken, f"{page}: images that did not load: {broken}"


@pytest.mark.parametrize("page", PAGES)
def test_no_traceback_outside_raises_exception_cells(pages: dict[str, Page], page: str):
    """Only cells tagged ``raises-exception`` may show an error."""
    tracebacks = pages[page].data["tracebacks"]
    assert not tracebacks, (
        f"{page}: {len(tracebacks)} output(s) outside `raises-exception` cells show a "
        "traceback:\n" + "\n---\n".join(tracebacks)
    )


@pytest.mark.parametrize("page", PAGES)
def test_outputs_show_no_build_machine_path(pages: dict[str, Page], page: str):
    """No output shows where the book was built (a full traceback or a warning would)."""
    leaks = pages[page].data["paths"]
    assert not leaks, (
        f"{page}: {len(leaks)} output(s) show the build checkout's path {ROOT} (use short "
        "tracebacks, %xmode Minimal):\n" + "\n---\n".join(leaks)
    )


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(pages: dict[str, Page], site: str, page: str):
    """Every link to the book's own pages answers 200, and its ``#anchor`` exists there."""
    broken = []
    for href in sorted(set(pages[page].data["links"])):
        if not href.startswith(site):
            continue
        target, _, anchor = href.partition("#")
        status, anchors = fetch(target)
        if status != 200:
            broken.append(f"{href} (HTTP {status})")
        elif anchor and urllib.parse.unquote(anchor) not in anchors:
            broken.append(f"{href} (no element with id {anchor!r} on {target})")
    assert not broken, f"{page}: broken internal links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", CHAPTERS)
def test_colab_launch_link_opens_this_notebook(pages: dict[str, Page], page: str):
    """The launch menu's Colab link opens this chapter's own notebook on the main branch."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repository = config["repository"]["url"].removeprefix("https://github.com/")
    expected = f"{COLAB}{repository}/blob/{config['repository']['branch']}/{page}.ipynb"
    links = pages[page].data["colab"]
    assert expected in links, f"{page}: no Colab launch link {expected}; links found: {links}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_exercise_solutions_are_collapsed(pages: dict[str, Page], page: str):
    """Each solution is a closed ``<details class="solution">``: only its summary shows."""
    solutions = pages[page].data["solutions"]
    written = markdown_of(page).count('<details class="solution">')
    assert solutions, (
        f'{page}: no <details class="solution"> on the page (the chapter source has {written}); '
        "solutions must use that form, collapsed in Jupyter, Colab and the HTML"
    )
    assert len(solutions) == written, (
        f"{page}: {len(solutions)} solutions rendered, the source writes {written}"
    )
    shown = [s["summary"] for s in solutions if s["open"] or not s["hidden"]]
    assert not shown, f"{page}: solutions shown open: {shown}"


@pytest.mark.parametrize("page", PAGES)
def test_glued_numbers_rendered(pages: dict[str, Page], page: str):
    """Each ``{glue:text}`` role of the source shows its value (MyST-NB's ``pasted-text``);
    no role is left as literal text."""
    roles = len(GLUE_TEXT_ROLE.findall(markdown_of(page)))
    data = pages[page].data
    assert "{glue" not in data["prose"], f"{page}: a glue role is shown as literal text"
    assert data["glued"] >= roles, (
        f"{page}: the source uses {roles} glue role(s), only {data['glued']} value(s) rendered"
    )


@pytest.mark.parametrize("page", PAGES)
def test_math_rendered_by_mathjax(pages: dict[str, Page], site: str, page: str):
    """Every formula is typeset (``mjx-container``) by the MathJax the book serves itself."""
    data = pages[page].data
    if data["math"]:
        assert data["mathjax"], f"{page}: has formulas but MathJax did not load (offline?)"
    raw = [m["text"] for m in data["math"] if not m["rendered"]]
    assert not raw, f"{page}: {len(raw)} formulas left as raw TeX, e.g. {raw[:3]}"
    leftovers = re.findall(r".{0,30}(?:\$\$|\\\(|\\\[|\$\\[A-Za-z]).{0,30}", data["prose"])
    assert not leftovers, f"{page}: raw TeX in the prose: {leftovers[:5]}"


def test_every_page_visited_quickly(pages: dict[str, Page]):
    """All pages were opened; prints how long each took (the browser test's cost in CI)."""
    assert list(pages) == PAGES
    for page, result in pages.items():
        print(f"{result.seconds:6.1f} s  {page}")
