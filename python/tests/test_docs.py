"""Every Python block of the pages under docs/, each page's run in order in
one namespace, as a reader would paste them: the pages' claims are checked,
not just their syntax. (README's blocks are test_readme.py's.)"""
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def _blocks(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def test_real_code_page_runs():
    pytest.importorskip("transformers", reason="docs/real-code.md's examples need transformers (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)")
    blocks = _blocks("real-code.md")
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/real-code.md", "exec"), namespace)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md") if p.name != "real-code.md"))
def test_every_other_page_runs(page):
    namespace: dict = {}
    for block in _blocks(page):
        exec(compile(block, f"docs/{page}", "exec"), namespace)
