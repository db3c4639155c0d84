"""The documentation site's listing pages read their code from the sources by anchors
(docs/_ext/ft_sources.py): a moved marker or definition moves what the page shows, and an anchor that no
longer matches is an error (the site's build fails on it) rather than a stale page."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import ft_sources as S  # noqa: E402

CPP = """// a file
namespace ft {

// the forward of line 1
template <class T>
void Thing<T>::forward(const T* x,
                       T* y) const {
    y[0] = x[0];  // line 1
}

void other() {}

// [doc:core]
    int a = 1;
    int b = 2;
// [/doc:core]

template <class T>
class Rule final : public Base {
public:
    bool allowed() const override { return true; }
};
}  // namespace ft
"""


def write(tmp_path, text, name="src/x.cpp"):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return name


def test_a_definition_with_its_comment_and_template_line(tmp_path):
    rel = write(tmp_path, CPP)
    r = S.region(tmp_path, rel + "::Thing<T>::forward")
    assert (r.start, r.end) == (4, 9)
    assert r.text.splitlines()[0] == "// the forward of line 1" and r.text.splitlines()[-1] == "}"
    c = S.region(tmp_path, rel + "::class Rule")
    assert c.text.splitlines()[0] == "template <class T>" and c.text.splitlines()[-1] == "};"


def test_a_moved_marker_moves_the_region(tmp_path):
    rel = write(tmp_path, CPP)
    before = S.region(tmp_path, rel + "#core")
    assert (before.start, before.end, before.text) == (14, 15, "int a = 1;\nint b = 2;")
    # move the opening marker down one line: the region loses its first line
    moved = CPP.replace("// [doc:core]\n    int a = 1;\n", "    int a = 1;\n// [doc:core]\n")
    write(tmp_path, moved)
    after = S.region(tmp_path, rel + "#core")
    assert (after.start, after.end, after.text) == (15, 15, "int b = 2;")
    # lines added above a definition move it
    write(tmp_path, "// new\n// lines\n\n" + CPP)
    assert S.region(tmp_path, rel + "::Thing<T>::forward").start == 7


def test_anchors_that_match_nothing_are_errors(tmp_path):
    rel = write(tmp_path, CPP)
    for spec in (rel + "::Thing<T>::backward", rel + "#nowhere", rel + "::class Gone", "src/none.cpp::f",
                 rel + "@^// no such line", "no-anchor"):
        with pytest.raises(S.SourceRegionError):
            S.region(tmp_path, spec)
    # a declaration is not a definition
    write(tmp_path, "void f(int);\n", "src/y.cpp")
    with pytest.raises(S.SourceRegionError):
        S.region(tmp_path, "src/y.cpp::f")


def test_alternatives_take_the_first_that_matches(tmp_path):
    rel = write(tmp_path, CPP)
    assert S.region(tmp_path, "src/gone.cpp::f || " + rel + "::other").text == "void other() {}"
    assert S.region(tmp_path, rel + "::other || src/gone.cpp::f").start == 11
    with pytest.raises(S.Omitted):
        S.region(tmp_path, "src/gone.cpp::f || " + rel + "::nothing || -")
    with pytest.raises(S.SourceRegionError) as e:
        S.region(tmp_path, "src/gone.cpp::f || " + rel + "::nothing")
    assert not isinstance(e.value, S.Omitted)


def test_python_functions_and_header_comments(tmp_path):
    rel = write(tmp_path, "import x\n\n# Algorithm 9: a comment\n\ndef f(a):\n    return a\n\n\ndef g():\n    pass\n",
                "pkg/m.py")
    r = S.region(tmp_path, rel + "::f")
    assert r.text == "def f(a):\n    return a" and (r.start, r.end) == (5, 6)
    hdr = write(tmp_path, "// Algorithm 1: e <- W_e[:, v]\n//   1  return e\n//\n// other\n", "h.hpp")
    assert S.region(tmp_path, hdr + "@^// Algorithm 1:").text == "Algorithm 1: e <- W_e[:, v]\n  1  return e"


def test_every_listing_of_the_site_resolves_against_this_checkout():
    from ft_listings_table import GROUPS, LISTINGS

    assert sorted(l["id"] for l in LISTINGS) == sorted(i for _, ids in GROUPS for i in ids)
    for l in LISTINGS:
        if ".md|" in l["pseudo"]:
            rel, heading = l["pseudo"].split("|", 1)
            assert S.markdown_section(ROOT, rel, heading).end > S.markdown_section(ROOT, rel, heading).start
        else:
            assert S.region(ROOT, l["pseudo"]).text
        for _, spec in l["cpp"]:
            try:
                assert S.region(ROOT, spec).text
            except S.Omitted:  # "A || -": a block that may be left out (code moving between files)
                assert spec.endswith("|| -")
        for name in l["numpy"]:
            assert S.region(ROOT, "python/formal_transformers/reference.py::" + name).text
        assert sum(len(S.test_functions(ROOT, rel, pat)) for rel, pat in l["checks"]) > 0, l["id"]
