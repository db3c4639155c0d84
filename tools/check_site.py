#!/usr/bin/env python3
"""Checks of the documentation site that ./run.sh docs builds (build/docs).

  check_site.py links SITE        every relative link and image of every page points at a file of the
                                  site, and every #fragment at an id on that page
  check_site.py browser SITE OUT  the site served on 127.0.0.1 and opened in headless Chromium: on the
                                  listing pages and a notebook page the math is typeset (no raw TeX left),
                                  every code block drawn from the sources equals the region its anchor
                                  names in the sources now (so a page built from other sources, or an
                                  anchor that moved without a rebuild, fails), the notebook's images
                                  loaded; the search finds "MHAttention". Screenshots of three pages go
                                  to OUT.
Each failure is printed; the exit status is 1 if there was any.
"""
from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

LISTING_PAGES = ["listings/alg4.html", "listings/alg5.html", "listings/alg10.html", "listings/v1.html",
                 "listings/s8.html", "listings/v29.html"]
NOTEBOOK_PAGE = "notebooks/02_components.html"
SCREENSHOTS = {"listing-alg4.png": "listings/alg4.html", "notebook-02-components.png": NOTEBOOK_PAGE,
               "listings-index.png": "listings/index.html"}


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and "name" in a:
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("preconnect", "dns-prefetch")):
                self.refs.append((tag, a[key]))


def check_links(site: Path) -> list[str]:
    pages = sorted(site.rglob("*.html"))
    parsed = {}

    def parse(p: Path):
        if p not in parsed:
            h = _Links()
            h.feed(p.read_text(encoding="utf-8", errors="replace"))
            parsed[p] = h
        return parsed[p]

    errors = []
    n = 0
    for page in pages:
        for tag, ref in parse(page).refs:
            u = urllib.parse.urlsplit(ref)
            if u.scheme or ref.startswith("//"):
                if u.scheme in ("http", "https") and u.hostname in ("127.0.0.1", "localhost"):
                    errors.append(f"{page.relative_to(site)}: link to a local server {ref}")
                continue  # external links are not followed (no network in CI)
            n += 1
            target = page if not u.path else (page.parent / urllib.parse.unquote(u.path)).resolve()
            if u.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            if not target.exists():
                errors.append(f"{page.relative_to(site)}: <{tag}> {ref}: no such file")
                continue
            if u.fragment and target.suffix == ".html":
                frag = urllib.parse.unquote(u.fragment)
                if frag not in parse(target).ids:
                    errors.append(f"{page.relative_to(site)}: {ref}: no id {frag!r} in {target.relative_to(site.resolve())}")
    print(f"links: {n} internal links and images in {len(pages)} pages, {len(errors)} broken")
    return errors


# ------------------------------------------------------------------------------------------------ browser
CHECK_PAGE = r"""<!doctype html><html><body><pre id="ft-result">running</pre><script>
const pages = %(pages)s;
const sleep = ms => new Promise(r => setTimeout(r, ms));
function load(src) {
  return new Promise(resolve => {
    const f = document.createElement('iframe');
    f.style.width = '1400px'; f.style.height = '1000px';
    f.onload = () => resolve(f);
    f.src = src; document.body.appendChild(f);
  });
}
function rawTex(doc) {
  // text outside code, scripts and typeset math that still holds TeX delimiters or commands
  const bad = [];
  const walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
  let n;
  while ((n = walker.nextNode())) {
    const p = n.parentElement;
    if (p.closest('pre, code, script, style, mjx-container, textarea, .highlight')) continue;
    const t = n.textContent;
    if (/\\\(|\\\)|\\\[|\\\]|\$\$|\\frac|\\mathbb|\\tilde|\\sqrt|\\operatorname/.test(t)) bad.push(t.trim().slice(0, 120));
  }
  return bad;
}
async function inspect(page) {
  const f = await load(page);
  const w = f.contentWindow, doc = f.contentDocument;
  for (let i = 0; i < 200 && !(w.MathJax && w.MathJax.startup && w.MathJax.startup.promise); i++) await sleep(50);
  if (w.MathJax && w.MathJax.startup) await w.MathJax.startup.promise;
  for (let i = 0; i < 100 && [...doc.images].some(im => !im.complete); i++) await sleep(50);
  const math = [...doc.querySelectorAll('.math')];
  const regions = [...doc.querySelectorAll('.ft-region-meta')].map(m => {
    const pre = m.nextElementSibling && (m.nextElementSibling.matches('pre') ? m.nextElementSibling : m.nextElementSibling.querySelector('pre'));
    let text = null;
    if (pre) { const c = pre.cloneNode(true); c.querySelectorAll('.linenos').forEach(e => e.remove()); text = c.textContent; }
    return {spec: m.dataset.spec, path: m.dataset.path, start: +m.dataset.start, end: +m.dataset.end, text};
  });
  return {
    page, title: doc.title,
    mathjax: !!w.MathJax, typeset: doc.querySelectorAll('mjx-container').length,
    math_elements: math.length, untypeset: math.filter(e => !e.querySelector('mjx-container')).length,
    raw_tex: rawTex(doc), regions,
    images: [...doc.images].map(im => ({src: im.getAttribute('src').slice(0, 80), ok: im.complete && im.naturalWidth > 0})),
  };
}
async function search(q) {
  const f = await load('search.html?q=' + encodeURIComponent(q));
  const doc = f.contentDocument;
  let links = [];
  for (let i = 0; i < 400; i++) {
    links = [...doc.querySelectorAll('#search-results li a, ul.search li a')].map(a => a.getAttribute('href'));
    const summary = doc.querySelector('.search-summary, #search-results > p');
    if (links.length && summary && /\d/.test(summary.textContent)) break;  // "… found N page(s) …"
    await sleep(50);
  }
  return {query: q, results: links};
}
(async () => {
  const out = {pages: []};
  try {
    for (const p of pages) out.pages.push(await inspect(p));
    out.search = await search('MHAttention');
  } catch (e) { out.error = String(e); }
  document.getElementById('ft-result').textContent = 'RESULT' + JSON.stringify(out);
})();
</script></body></html>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise SystemExit("check_site.py: no chromium on the PATH (apt-get install chromium)")


def _serve(site: Path, check_page: str):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/__ft_check.html"):
                body = check_page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _run_chromium(args, timeout=180):
    with tempfile.TemporaryDirectory() as prof:
        cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-extensions", "--disable-background-networking",
               f"--user-data-dir={prof}", "--hide-scrollbars", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _normalise(text: str) -> str:
    return textwrap.dedent("\n".join(l.rstrip() for l in text.strip("\n").split("\n")))


def check_browser(site: Path, out: Path) -> list[str]:
    from ft_sources import region

    pages = LISTING_PAGES + [NOTEBOOK_PAGE]
    srv = _serve(site, CHECK_PAGE % {"pages": json.dumps(pages)})
    base = f"http://127.0.0.1:{srv.server_address[1]}/"
    errors = []
    try:
        for attempt in range(2):  # a browser that gave no answer at all is tried once more; a check that failed is not
            r = _run_chromium(["--virtual-time-budget=120000", "--dump-dom", base + "__ft_check.html"])
            m = re.search(r"RESULT(\{.*\})</pre>", r.stdout, re.S)
            if m:
                break
        if not m:
            return [f"browser: no result from Chromium (exit {r.returncode}): {r.stderr[-2000:]}"]
        res = json.loads(html.unescape(m.group(1)))
        if res.get("error"):
            errors.append(f"browser: {res['error']}")
        for p in res["pages"]:
            name = p["page"]
            if not p["mathjax"]:
                errors.append(f"{name}: MathJax did not load")
            if p["typeset"] == 0 or p["untypeset"]:
                errors.append(f"{name}: {p['typeset']} formulas typeset, {p['untypeset']} of {p['math_elements']} left as TeX")
            if p["raw_tex"]:
                errors.append(f"{name}: raw TeX on the page: {p['raw_tex'][:3]}")
            for g in p["regions"]:
                try:
                    now = region(ROOT, g["spec"])
                except Exception as e:  # the anchor is gone from the sources
                    errors.append(f"{name}: {g['spec']}: {e}")
                    continue
                if (now.start, now.end) != (g["start"], g["end"]):
                    errors.append(f"{name}: {g['spec']}: the page shows lines {g['start']}–{g['end']}, the "
                                  f"source has them at {now.start}–{now.end} (built from other sources?)")
                if g["text"] is None or _normalise(g["text"]) != _normalise(now.text):
                    errors.append(f"{name}: {g['spec']}: the code on the page differs from {now.path} lines "
                                  f"{now.start}–{now.end}")
            n_regions = len(p["regions"])
            if name.startswith("listings/") and n_regions < 2:
                errors.append(f"{name}: {n_regions} code blocks from the sources (want the listing and its code)")
            if name == NOTEBOOK_PAGE:
                if not p["images"]:
                    errors.append(f"{name}: no images")
                bad = [i["src"] for i in p["images"] if not i["ok"]]
                if bad:
                    errors.append(f"{name}: {len(bad)} images did not load: {bad[:3]}")
            print(f"browser: {name}: {p['typeset']} formulas typeset, {n_regions} source regions, "
                  f"{len(p['images'])} images")
        s = res.get("search") or {}
        hits = s.get("results", [])
        print(f"browser: search {s.get('query')!r}: {len(hits)} results, first {hits[:3]}")
        if not any("reference" in h or "alg5" in h or "api" in h for h in hits):
            errors.append(f"search for MHAttention found no API or listing page: {hits[:10]}")
        out.mkdir(parents=True, exist_ok=True)
        for fname, page in SCREENSHOTS.items():
            shot = out / fname
            shot.unlink(missing_ok=True)
            _run_chromium(["--window-size=1500,1600", "--virtual-time-budget=15000", f"--screenshot={shot}",
                           base + page])
            if not shot.exists() or shot.stat().st_size < 10000:
                errors.append(f"no screenshot of {page}")
            else:
                print(f"browser: screenshot {shot}")
    finally:
        srv.shutdown()
    return errors


def main(argv):
    if len(argv) < 2 or argv[0] not in ("links", "browser"):
        print(__doc__)
        return 2
    site = Path(argv[1]).resolve()
    if not (site / "index.html").exists():
        print(f"check_site.py: {site} holds no built site (index.html)")
        return 1
    errors = check_links(site) if argv[0] == "links" else check_browser(site, Path(argv[2]))
    for e in errors:
        print("FAIL", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
