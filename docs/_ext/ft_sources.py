"""Regions of the repository's source files, found by anchors, for the documentation site.

The listing pages show code straight from the sources: nothing is copied into docs/. A region is named by
a spec string:

* ``path::Name``  a C++ definition at column 0 whose line holds ``Name(`` (e.g.
  ``cpp/src/listings/norm.cpp::LayerNorm<T>::forward``), with its ``template <...>`` line and the comment
  lines right above it, up to the ``}`` that closes it at column 0;
* ``path::name``  for a ``.py`` file, the function ``name`` (``reference.py::rope``), with the comment
  lines right above it;
* ``path#marker`` the lines between the comments ``[doc:marker]`` and ``[/doc:marker]`` (any comment
  syntax), without the marker lines;
* ``A || B`` the first of the alternatives that matches (``|| -``: none is fine, the block is omitted);
* ``path@start@end`` from the first line matching the regular expression ``start`` up to (not
  including) the next line matching ``end`` (default: an empty comment line or a line that is not a
  comment); comment leaders (``// ``) are stripped. Used for the pseudocode in the headers.

Every lookup that finds nothing raises SourceRegionError naming the spec, so a renamed function or a
moved marker fails the site build (warnings are errors there) instead of leaving a stale page.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


class SourceRegionError(LookupError):
    pass


@dataclass
class Region:
    path: str        # relative to the repository root
    start: int       # 1-based first line
    end: int         # 1-based last line
    text: str

    @property
    def language(self) -> str:
        suffix = Path(self.path).suffix
        return {".py": "python", ".md": "markdown"}.get(suffix, "cpp")


def _read(root: Path, rel: str) -> list[str]:
    p = root / rel
    if not p.is_file():
        raise SourceRegionError(f"{rel}: no such file")
    return p.read_text(encoding="utf-8").splitlines()


def _comment_lines_above(lines: list[str], i: int) -> int:
    """Index of the first line of the comment block (and template line) right above line i (0-based)."""
    j = i
    while j > 0 and (lines[j - 1].startswith("template") or lines[j - 1].lstrip().startswith(("//", "#"))
                     and not lines[j - 1].lstrip().startswith(("#include", "#pragma", "#if", "#endif", "#define"))):
        j -= 1
    return j


def cpp_definition(root: Path, rel: str, name: str) -> Region:
    lines = _read(root, rel)
    if name.startswith(("class ", "struct ")):  # a class at column 0, up to its "};"
        kind, cname = name.split(" ", 1)
        head = re.compile(r"^" + kind + r"\s+" + re.escape(cname) + r"\b[^;]*$")
        for i, line in enumerate(lines):
            if head.match(line):
                end = next((m for m in range(i + 1, len(lines)) if lines[m].startswith("};")), None)
                if end is None:
                    raise SourceRegionError(f"{rel}::{name}: no closing '}};' at column 0")
                begin = _comment_lines_above(lines, i)
                return Region(rel, begin + 1, end + 1, "\n".join(lines[begin:end + 1]))
        raise SourceRegionError(f"{rel}::{name}: no {kind} {cname} at column 0")
    pat = re.compile(r"(^|[\s*&:])" + re.escape(name) + r"\s*\(")
    for i, line in enumerate(lines):
        if not line or line[0].isspace() or line.startswith(("//", "#", "template", "}")):
            continue
        if not pat.search(line):
            continue
        # a definition: the statement reaches "{" before ";"
        k = i
        while k < len(lines) and "{" not in lines[k] and not lines[k].rstrip().endswith(";"):
            k += 1
        if k >= len(lines) or "{" not in lines[k]:
            continue
        end = k
        if not lines[k].rstrip().endswith("}") or lines[k].count("{") != lines[k].count("}"):
            end = next((m for m in range(k + 1, len(lines)) if lines[m].rstrip() == "}"), None)
            if end is None:
                raise SourceRegionError(f"{rel}::{name}: no closing brace at column 0")
        begin = _comment_lines_above(lines, i)
        return Region(rel, begin + 1, end + 1, "\n".join(lines[begin:end + 1]))
    raise SourceRegionError(f"{rel}::{name}: no definition of {name}( at column 0")


def py_function(root: Path, rel: str, name: str) -> Region:
    lines = _read(root, rel)
    tree = ast.parse("\n".join(lines))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            first = node.lineno - 1 - len(getattr(node, "decorator_list", []))
            begin = first
            while begin > 0 and lines[begin - 1].lstrip().startswith("#"):
                begin -= 1
            end = node.end_lineno
            return Region(rel, begin + 1, end, "\n".join(lines[begin:end]))
    raise SourceRegionError(f"{rel}::{name}: no top-level function or class {name}")


def marked(root: Path, rel: str, marker: str) -> Region:
    lines = _read(root, rel)
    open_re = re.compile(r"\[doc:" + re.escape(marker) + r"\]")
    close_re = re.compile(r"\[/doc:" + re.escape(marker) + r"\]")
    starts = [i for i, l in enumerate(lines) if open_re.search(l)]
    if len(starts) != 1:
        raise SourceRegionError(f"{rel}#{marker}: {len(starts)} opening markers [doc:{marker}] (want 1)")
    s = starts[0]
    e = next((i for i in range(s + 1, len(lines)) if close_re.search(lines[i])), None)
    if e is None:
        raise SourceRegionError(f"{rel}#{marker}: no closing marker [/doc:{marker}]")
    body = lines[s + 1:e]
    # drop the common indentation
    ind = min((len(l) - len(l.lstrip()) for l in body if l.strip()), default=0)
    return Region(rel, s + 2, e, "\n".join(l[ind:] for l in body))


_LEADER = re.compile(r"^\s*(//|#)\s?")


def anchored(root: Path, rel: str, start: str, end: str | None) -> Region:
    lines = _read(root, rel)
    s_re = re.compile(start)
    e_re = re.compile(end) if end else None
    s = next((i for i, l in enumerate(lines) if s_re.search(l)), None)
    if s is None:
        raise SourceRegionError(f"{rel}@{start}: no line matches")
    e = s + 1
    while e < len(lines):
        l = lines[e]
        if e_re is not None and e_re.search(l):
            break
        if e_re is None and (not _LEADER.match(l) or not _LEADER.sub("", l).strip()):
            break
        e += 1
    text = "\n".join(_LEADER.sub("", l, count=1) for l in lines[s:e])
    return Region(rel, s + 1, e, text.rstrip())


class Omitted(SourceRegionError):
    """Every alternative of a spec ending in `|| -` failed: the block is left out of the page."""


def region(root: Path, spec: str) -> Region:
    """The region named by spec (see the module docstring). `A || B` tries A, then B (code that is moving
    between files); a last alternative `-` leaves the block out (raises Omitted) when none matches."""
    if "||" in spec:
        alts = [a.strip() for a in spec.split("||")]
        err = None
        for a in alts:
            if a == "-":
                raise Omitted(f"{spec}: omitted ({err})")
            try:
                return region(root, a)
            except SourceRegionError as e:
                err = e
        raise SourceRegionError(f"{spec}: no alternative matches (last: {err})")
    return _region(Path(root), spec)


def _region(root: Path, spec: str) -> Region:
    if "@" in spec:
        rel, start, *rest = spec.split("@")
        return anchored(root, rel, start, rest[0] if rest and rest[0] else None)
    if "#" in spec:
        rel, marker = spec.split("#", 1)
        return marked(root, rel, marker)
    if "::" in spec:
        rel, name = spec.split("::", 1)
        if rel.endswith(".py"):
            return py_function(root, rel, name)
        return cpp_definition(root, rel, name)
    raise SourceRegionError(f"{spec}: want path::Name, path#marker or path@start@end")


def markdown_section(root: Path, rel: str, heading: str) -> Region:
    """A section of a Markdown file: from the heading line that starts with `heading` to the next rule
    (a line of dashes) or heading of the same or a higher level."""
    lines = _read(root, rel)
    s = next((i for i, l in enumerate(lines) if l.startswith(heading)), None)
    if s is None:
        raise SourceRegionError(f"{rel}: no heading starting with {heading!r}")
    level = len(lines[s]) - len(lines[s].lstrip("#"))
    e = s + 1
    while e < len(lines):
        l = lines[e]
        if re.match(r"^-{5,}\s*$", l):
            break
        m = re.match(r"^(#+)\s", l)
        if m and len(m.group(1)) <= level:
            break
        e += 1
    return Region(rel, s + 1, e, "\n".join(lines[s:e]).rstrip())


def test_functions(root: Path, rel: str, pattern: str) -> list[tuple[str, int, str]]:
    """(name, line, first docstring line or comment above) of the tests in rel whose name matches the
    regular expression `pattern`: Python `def test_*` (also inside classes) or GoogleTest TEST/TEST_P."""
    lines = _read(root, rel)
    rx = re.compile(pattern)
    out = []
    if rel.endswith(".py"):
        tree = ast.parse("\n".join(lines))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test") \
                    and rx.search(node.name):
                doc = ast.get_docstring(node) or ""
                if not doc:
                    j = node.lineno - 2 - len(node.decorator_list)
                    com = []
                    while j >= 0 and lines[j].lstrip().startswith("#"):
                        com.insert(0, lines[j].lstrip()[1:].strip())
                        j -= 1
                    doc = " ".join(com)
                out.append((node.name, node.lineno, doc.strip().split("\n\n")[0].replace("\n", " ")))
        out.sort(key=lambda t: t[1])
    else:
        t_re = re.compile(r"^\s*(TEST|TEST_F|TEST_P)\(\s*(\w+)\s*,\s*(\w+)\s*\)")
        for i, l in enumerate(lines):
            m = t_re.match(l)
            if m and rx.search(m.group(2) + "." + m.group(3)):
                j = i - 1
                com = []
                while j >= 0 and lines[j].lstrip().startswith("//"):
                    com.insert(0, lines[j].lstrip()[2:].strip())
                    j -= 1
                out.append((m.group(2) + "." + m.group(3), i + 1, " ".join(com)))
    if not out:
        raise SourceRegionError(f"{rel}: no test matches {pattern!r}")
    return out
