"""The glossary (reloadsafe/glossary.py): docs/violations.md is what it
generates, every violation and warning the checks give has an entry, and a
failed report's table points at the entries that apply."""
import pathlib

import pytest
import torch

from reloadsafe import check_reload, glossary

import sample_layers as sl
import zoo

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "violations.md"


def test_docs_violations_md_is_what_the_glossary_generates():
    assert PAGE.read_text() == glossary.page(), "stale: python -m reloadsafe.glossary docs/violations.md"


def _reports():
    for cls in sl.NEGATIVE_CONTROLS:
        shape = getattr(cls, "input_shape")  # noqa: B009 - every control has one; mypy sees a list of types
        yield cls.__name__, check_reload(cls, torch.randn(*shape), reloads=2)
    for bug in zoo.BUGS:
        if bug.gap is None and not bug.needs:
            yield bug.id, check_reload(bug.buggy, bug.example_input, reloads=2, **bug.check_options("buggy"))


def test_every_violation_and_warning_has_an_entry():
    seen = 0
    for name, report in _reports():
        assert not report.ok, (name, report.table())
        for mode in report.modes.values():
            for v in mode["violations"]:
                text = f"{v['tensor']}: {v['what']}"
                assert any(m in text for k in glossary.KINDS for m in k.marks), (name, v)
                seen += 1
            for w in mode["warnings"]:
                assert any(m in w["message"] for k in glossary.KINDS for m in k.marks), (name, w)
    assert seen > 50


def test_a_failed_report_points_at_the_entries_that_apply():
    table = check_reload(sl.RebuiltScale, torch.randn(*sl.RebuiltScale.input_shape), reloads=2).table()
    assert "docs/violations.md (#address" in table, table
    assert "docs/violations.md" not in check_reload(sl.Transposed, torch.randn(8, 32), reloads=2).table()


@pytest.mark.parametrize("kind", glossary.KINDS, ids=lambda k: k.anchor)
def test_each_entry_is_whole(kind):
    assert kind.means and kind.cause and kind.fix and kind.named_by and kind.marks
    assert f'<a id="{kind.anchor}"></a>' in glossary.page()
