"""docs/api.md is what tools/api_reference.py generates from the package's
docstrings now: a public name, signature or docstring changed without the
reference is a failure (regenerate with the command in docs/api.md)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_api_md_is_what_the_docstrings_give():
    page = _generator().page()
    assert (ROOT / "docs" / "api.md").read_text() == page, (
        "docs/api.md is stale: PYTHONPATH=<the built package folder> python3 tools/api_reference.py docs/api.md")


def test_every_public_name_is_in_the_reference():
    import reloadsafe

    page = (ROOT / "docs" / "api.md").read_text()
    for name in reloadsafe.__all__:
        assert f"`reloadsafe.{name}" in page, name
