"""The documentation site: ``mkdocs build --strict`` passes (every link and anchor checked), the built
pages load nothing from the web, and the home page and a results page load in headless Chromium with no
script errors and every image decoded (the same way the HTML report is checked); the site's search
returns results for a typed word opened from ``file://`` (Material's offline plugin with the web-worker
shim served from the site) and over http; the navigation has at most 12 top-level entries, each
section opening with its index page and the dated records under one entry.
``LSBENCH_KEEP_SCREENSHOT=/some/dir`` keeps a screenshot of the home page there (its figure at page width).

Skipped, with the reason, where mkdocs (the dev extra) or Chromium is not installed.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cdp_pipe import Browser

from helpers import CHROMIUM, NO_CHROMIUM, headless_chromium

ROOT = Path(__file__).resolve().parents[1]


def _mkdocs() -> list[str] | None:
    exe = Path(sys.executable).with_name("mkdocs")
    if exe.exists():
        return [str(exe)]
    if shutil.which("mkdocs"):
        return [shutil.which("mkdocs")]
    return None


MKDOCS = _mkdocs()
pytestmark = pytest.mark.skipif(MKDOCS is None, reason="mkdocs is not installed (pip install -e '.[dev]')")

# Runs first in the page: records script errors, failed resource loads and console.error calls, then
# after load writes them and every image's state into a <pre> that --dump-dom shows.
PROBE = """<script>
window.__lsb = [];
window.addEventListener('error', e => { __lsb.push(e.message || ('failed to load ' +
  ((e.target && (e.target.src || e.target.href)) || '?'))); }, true);
window.addEventListener('unhandledrejection', e => __lsb.push('unhandled rejection: ' + e.reason));
const __ce = console.error; console.error = (...a) => { __lsb.push(a.join(' ')); __ce(...a); };
window.addEventListener('load', () => setTimeout(() => {
  const p = document.createElement('pre'); p.id = 'lsb-check';
  p.textContent = JSON.stringify({errors: __lsb, images: [...document.images].map(i => (
    {src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth, shown: i.getBoundingClientRect().width}))});
  document.body.appendChild(p); }, 300));
</script>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [*MKDOCS, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_build_is_strict_and_offline(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    outside = set()
    for page in pages:
        text = page.read_text(encoding="utf-8")
        # what a browser would fetch to show the page: scripts, styles, fonts, images
        for tag in re.findall(r"<(?:script|link|img|source|iframe)\b[^>]*>", text):
            outside.update(re.findall(r"""(?:src|href)=["']?(https?://[^"' >]+)""", tag))
        outside.update(re.findall(r"""@import\s+url\(["']?(https?://[^)"']+)""", text))
    for css in site.rglob("*.css"):
        outside.update(re.findall(r"""url\(["']?(https?://[^)"']+)""", css.read_text(encoding="utf-8")))
    assert not outside, sorted(outside)[:10]
    assert (site / "index.html").exists() and (site / "results" / "methods_fp4.html").exists()


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.parametrize("name, min_images", [("index.html", 1), ("results/methods_fp4.html", 3)])
def test_page_loads_in_chromium(site, tmp_path, name, min_images):
    page = site / name
    probed = page.with_name("probed-" + page.name)  # beside it, so its relative links resolve alike
    text = page.read_text(encoding="utf-8")
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    dom = headless_chromium(tmp_path, "--dump-dom", probed.as_uri(), timeout=120).stdout
    m = re.search(r'<pre id="lsb-check">(.*?)</pre>', dom, re.S)
    assert m, f"the probe did not run; DOM starts: {dom[:300]!r}"
    import html

    got = json.loads(html.unescape(m.group(1)))
    assert got["errors"] == [], got["errors"]
    images = [i for i in got["images"] if not (i["src"] or "").startswith("data:")]
    assert len(images) >= min_images, images
    for img in images:
        assert img["complete"] and img["width"] > 0, img
        assert img["shown"] > 100, img


WORD = "adaptive"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _search(browser: Browser, url: str) -> tuple[int, str]:
    """Type WORD into the page's search box; the number of results listed and the results' heading."""
    browser.open(url)
    assert browser.wait_for("document.readyState === 'complete' && !!document.querySelector('.md-search__input')")
    browser.js("document.querySelector('.md-search__input').focus()")
    browser.type(WORD)
    n = browser.wait_for("document.querySelectorAll('.md-search-result__item').length", timeout=90) or 0
    return n, (browser.js("document.querySelector('.md-search-result__meta').textContent") or "").strip()


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_search_finds_a_word_from_disk_and_over_http(site, tmp_path):
    with Browser(CHROMIUM, tmp_path / "profile-file") as b:
        n, meta = _search(b, (site / "index.html").as_uri())
        keep = os.environ.get("LSBENCH_KEEP_SCREENSHOT")
        if keep:
            b.js("document.querySelector('.md-search__input').blur(); location.hash = ''")
            b.open((site / "index.html").as_uri())
            b.wait_for("document.readyState === 'complete'")
            b.screenshot(Path(keep) / "home.png")
    assert n > 0 and "matching" in meta, f"file://: {n} results, {meta!r}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Browser(CHROMIUM, tmp_path / "profile-http") as b:
            n, meta = _search(b, f"http://127.0.0.1:{server.server_address[1]}/index.html")
    finally:
        server.shutdown()
        server.server_close()
    assert n > 0 and "matching" in meta, f"http: {n} results, {meta!r}"


def test_the_navigation_is_sections_with_index_pages(site):
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # mkdocs' !ENV and python tags
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)["nav"]
    assert len(nav) <= 12, [next(iter(e)) if isinstance(e, dict) else e for e in nav]
    for entry in nav:
        if not isinstance(entry, dict):
            continue
        title, children = next(iter(entry.items()))
        if isinstance(children, list):
            assert isinstance(children[0], str) and children[0].endswith("index.md"), f"{title}: no index page first"
    records = [e for e in nav if isinstance(e, dict) and "Records" in e]
    assert len(records) == 1
    dated = [p for e in nav for p in re.findall(r"records/\d{4}-\d\d-\d\d-[\w-]+\.md", str(e))]
    assert dated and all(p in str(records[0]) for p in dated), "a dated record outside the Records section"
