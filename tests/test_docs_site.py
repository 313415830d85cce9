"""The documentation site: ``mkdocs build --strict`` passes (every link and anchor checked), the built
pages load nothing from the web, and the home page and a results page load in headless Chromium with no
script errors and every image decoded (the same way the HTML report is checked).

Skipped, with the reason, where mkdocs (the dev extra) or Chromium is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
