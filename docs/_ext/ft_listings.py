"""The listing pages of the documentation site: one page per listing of the paper (Algorithms 1–15, §4,
§8) and per listing this project adds (V·, T·, P, S, DP, D, ES), each built from the repository:

1. the listing itself: the pseudocode kept beside the code (the header comments of
   cpp/include/formal_transformers/, or the listing's section of docs/*.md),
2. the C++ forward and backward and the numpy transcription (python/formal_transformers/reference.py)
   side by side, pulled from the source files by anchors (ft_sources.py; never copied into docs/),
3. the checks that prove them: the tests, listed from the test files.

The pages are written into docs/listings/ at the start of every build (that folder is generated and
ignored by git); a listing whose anchor no longer matches fails the build (run.sh builds with -W).
"""
from __future__ import annotations

import html
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

from ft_listings_table import LISTINGS, GROUPS
from ft_sources import Omitted, SourceRegionError, markdown_section, region, test_functions

ROOT = Path(__file__).resolve().parents[2]


def _slug(lid: str) -> str:
    return lid.lower()


def _by_id():
    return {l["id"]: l for l in LISTINGS}


def write_pages(app):
    """docs/listings/<id>.md for every listing, and docs/listings/index.md (the front door's table)."""
    out = Path(app.srcdir) / "listings"
    out.mkdir(exist_ok=True)
    wanted = set()
    for l in LISTINGS:
        name = _slug(l["id"]) + ".md"
        wanted.add(name)
        lid = l["id"]
        pseudo = l["pseudo"]
        if ".md|" in pseudo:  # a section of docs/*.md, included as Markdown (its first line is the title)
            rel, heading = pseudo.split("|", 1)
            reg = markdown_section(ROOT, rel, heading)
            listing = (f"From `{rel}`, lines {reg.start}–{reg.end}:\n\n"
                       f"```{{include}} ../{Path(rel).name}\n:start-line: {reg.start}\n:end-line: {reg.end}\n```\n")
        else:
            listing = f"```{{ft-listing}} {lid}\n:part: pseudo\n```\n"
        text = (f"# {l['title']}\n\n```{{ft-listing}} {lid}\n:part: intro\n```\n\n"
                f"## The listing\n\n{listing}\n"
                f"## The code: C++ and numpy side by side\n\n```{{ft-listing}} {lid}\n:part: code\n```\n\n"
                f"## The checks that prove it\n\n```{{ft-listing}} {lid}\n:part: checks\n```\n")
        p = out / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
    rows = []
    by_id = _by_id()
    for group, ids in GROUPS:
        rows.append(f"\n## {group}\n\n| listing | what it computes | Python |\n| --- | --- | --- |")
        for lid in ids:
            l = by_id[lid]
            py = ", ".join(f"`{n}`" for n in l.get("python", [])) or " "
            rows.append(f"| [{l['short']}]({_slug(lid)}.md) | {l['summary']} | {py} |")
    toc = "\n".join(_slug(l["id"]) for l in LISTINGS)
    index = (
        "# The listings\n\n"
        "Every listing has a page: the pseudocode, then the C++ forward and backward pass and the numpy "
        "transcription side by side, then the tests that prove them equal. The code on these pages is read "
        "from the source files when the site is built, so it is the code of this checkout.\n"
        + "\n".join(rows)
        + f"\n\n```{{toctree}}\n:hidden:\n:maxdepth: 1\n\n{toc}\n```\n"
    )
    wanted.add("index.md")
    p = out / "index.md"
    if not p.exists() or p.read_text(encoding="utf-8") != index:
        p.write_text(index, encoding="utf-8")
    for old in out.glob("*.md"):
        if old.name not in wanted:
            old.unlink()


def _meta(reg, spec: str) -> nodes.Node:
    """An empty marker before a block: where it comes from (tools/check_site.py compares the page with the
    source region the spec names now, so a page built from other sources fails the check)."""
    return nodes.raw("", f'<div class="ft-region-meta" data-spec="{html.escape(spec)}" data-path="{html.escape(reg.path)}" '
                         f'data-start="{reg.start}" data-end="{reg.end}"></div>', format="html")


def _code_block(reg, label: str, spec: str) -> list[nodes.Node]:
    caption = f"{label} — {reg.path}, lines {reg.start}–{reg.end}"
    lit = nodes.literal_block(reg.text, reg.text, language=reg.language, linenos=True,
                              classes=["ft-source"])
    lit["highlight_args"] = {"linenostart": reg.start}
    lit["source"] = str(ROOT / reg.path)
    cont = nodes.container("", literal_block=True, classes=["literal-block-wrapper", "ft-region"])
    cap = nodes.caption(caption, "", nodes.Text(caption))
    cont += cap
    cont += lit
    # for the site's checks: where the block comes from
    cont["ids"] = []
    cont["classes"].append("ft-src-" + reg.path.replace("/", "-").replace(".", "-"))
    return [_meta(reg, spec), cont]


class ListingDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def _region(self, spec):
        try:
            reg = region(ROOT, spec)
        except Omitted:
            return None
        except SourceRegionError as e:
            raise self.error(f"ft-listing {self.arguments[0]}: {e}")
        self.env.note_dependency(str(ROOT / reg.path))
        return reg

    option_spec = {"part": directives.unchanged_required}

    def run(self):
        lid = self.arguments[0]
        l = _by_id().get(lid)
        if l is None:
            raise self.error(f"ft-listing: unknown listing {lid!r}")
        part = self.options.get("part", "intro")
        return getattr(self, "_" + part)(l)

    def _intro(self, l):
        out: list[nodes.Node] = []
        if l.get("tex"):  # the listing in the paper's notation, typeset
            tex = l["tex"]
            out.append(nodes.math_block(tex, tex, docname=self.env.docname, number=None, label=None,
                                        nowrap=False))
        out += self._parse(l["summary"][0].upper() + l["summary"][1:] + ". " + l.get("note", ""))
        return out

    def _pseudo(self, l):
        reg = self._region(l["pseudo"])
        out = self._parse(f"As it stands in `{reg.path}` (lines {reg.start}–{reg.end}), beside the code:")
        out.append(_meta(reg, l["pseudo"]))
        out.append(nodes.literal_block(reg.text, reg.text, language="text", classes=["ft-pseudo"]))
        return out

    def _code(self, l):
        grid = nodes.container(classes=["ft-sbs"])
        left = nodes.container(classes=["ft-col", "ft-col-cpp"])
        right = nodes.container(classes=["ft-col", "ft-col-numpy"])
        left += nodes.rubric("", "C++ (the core)")
        for label, spec in l.get("cpp", []):
            reg = self._region(spec)
            if reg is not None:
                for n in _code_block(reg, label, spec):
                    left += n
        right += nodes.rubric("", "numpy (formal_transformers.reference)")
        for spec in l.get("numpy", []):
            if "::" not in spec:
                spec = "python/formal_transformers/reference.py::" + spec
            for n in _code_block(self._region(spec), spec.split("::")[-1], spec):
                right += n
        if not l.get("numpy"):
            right += self._parse(l.get("numpy_note", "No numpy transcription: the tests compare the core "
                                                      "with the listing itself."))
        grid += left
        grid += right
        return [grid]

    def _checks(self, l):
        intro = self._parse("These tests run in CI (`./run.sh test`), listed from the test files when the site "
                            "is built; most are parametrized (dtypes, masks, the model options), so one name "
                            "stands for several cases.")
        items = nodes.bullet_list()
        for rel, pattern in l.get("checks", []):
            try:
                tests = test_functions(ROOT, rel, pattern)
            except SourceRegionError as e:
                raise self.error(f"ft-listing {l['id']}: {e}")
            self.env.note_dependency(str(ROOT / rel))
            for name, line, doc in tests:
                item = nodes.list_item()
                para = nodes.paragraph()
                para += nodes.literal(text=f"{rel}::{name}")
                para += nodes.Text(f" (line {line})" + (f" — {doc}" if doc else ""))
                item += para
                items += item
        return intro + [items]

    def _parse(self, text):
        c = nodes.container()
        self.state.nested_parse(StringList(text.split("\n")), self.content_offset, c)
        return list(c.children)


def setup(app):
    app.connect("builder-inited", write_pages)
    app.add_directive("ft-listing", ListingDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
