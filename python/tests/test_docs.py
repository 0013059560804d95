"""Every Python block of docs/real-code.md, run in order in one namespace,
as a reader would paste them: the page's claims are checked, not just
its syntax."""
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def _blocks(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def test_real_code_page_runs():
    pytest.importorskip("transformers", reason="docs/real-code.md's examples need transformers (tools/setup.sh installs it)")
    blocks = _blocks("real-code.md")
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/real-code.md", "exec"), namespace)
