"""Every reference into docs/ resolves: the code's `docs/FILE.md#anchor` citations (and the
`#anchor` items that follow one, as in "docs/kpu.md#pipeline and #sum-rule"), and every relative
link of README.md and docs/*.md, point at a file that exists and a heading it has (GitHub's
anchor rules). A clone is self-contained: nothing cites the specification outside the repository."""
import re

import pytest
from conftest import REPO

DOCS = REPO / "docs"
CODE = sorted(p for d in ("tl2k210", "tests", "bench") for p in (REPO / d).rglob("*.py")
              if p.name != "test_docs.py")
MARKDOWN = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

CITATION = re.compile(r"docs/([\w.-]+\.md)((?:#[\w-]+)?)((?:\s*(?:,|and)\s*#[a-z0-9-]+)*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    out, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            s = slug(line.lstrip("#"))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def check(target, anchor, where):
    assert target.is_file(), f"{where}: {target.relative_to(REPO)} does not exist"
    if anchor:
        assert anchor in anchors(target), (
            f"{where}: {target.relative_to(REPO)} has no heading for #{anchor}")


def code_refs():
    for path in CODE:
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.relative_to(REPO)}:{line}"
            names = [m.group(2)[1:]] + re.findall(r"#([a-z0-9-]+)", m.group(3))
            for name in names:
                yield where, DOCS / m.group(1), name


def test_code_citations_resolve():
    refs = list(code_refs())
    assert len(refs) > 80            # the code cites the reference docs throughout
    for where, target, anchor in refs:
        check(target, anchor, where)


@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: p.name)
def test_markdown_links_resolve(md):
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue                 # http:, mailto:
        file, _, anchor = target.partition("#")
        check(md.parent / file if file else md, anchor, f"{md.relative_to(REPO)} -> {target}")


def test_nothing_cites_the_outside_specification():
    """Code, messages and docs cite docs/ of this repository, never a specification outside it."""
    outside = re.compile(r"shared/docs|k210-kmodel-and-kpu\.md|k210-flashing-and-maixpy\.md|maixpy-api\.md|spec §")
    hits = []
    for path in CODE + MARKDOWN:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if outside.search(line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not hits, hits


def test_slug_follows_github():
    assert slug("The compiler: `tl2k210 convert`") == "the-compiler-tl2k210-convert"
    assert slug("v4 kpu conv body") == "v4-kpu-conv-body"
    assert slug("Host MaixPy: real board scripts on the PC (`tl2k210 demo`)") == \
        "host-maixpy-real-board-scripts-on-the-pc-tl2k210-demo"
