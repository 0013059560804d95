"""The case runner from Python: same results as the C++ runner on the golden
case files (golden/<area>.expected.jsonl)."""
import json
import pathlib

import pytest

import reloadsafe

ROOT = pathlib.Path(__file__).resolve().parents[2]
AREAS = sorted(p.name[: -len(".expected.jsonl")] for p in (ROOT / "golden").glob("*.expected.jsonl"))


def test_there_are_golden_cases():
    assert len(AREAS) >= 3


@pytest.mark.parametrize("area", AREAS)
def test_golden_file_matches_expected(area):
    results = reloadsafe.run_cases(ROOT / "golden" / f"{area}.jsonl")
    expected = [json.loads(line) for line in (ROOT / "golden" / f"{area}.expected.jsonl").read_text().splitlines() if line.strip()]
    assert results == expected


def test_evaluate_case_from_a_dict_and_a_line():
    case = {"id": "E2", "op": "extent", "shape": [4, 4], "stride": [1, 4]}
    assert reloadsafe.evaluate_case(case) == {"id": "E2", "extent": 16}
    assert reloadsafe.evaluate_case(json.dumps(case)) == {"id": "E2", "extent": 16}


def test_a_bad_case_is_an_error_result_not_an_exception():
    out = reloadsafe.evaluate_case('{"id": "X", "op": "no_such_op"}')
    assert out["id"] == "X" and "error" in out
    out = reloadsafe.evaluate_case("not json")
    assert "error" in out


def test_blank_lines_are_not_cases():
    assert reloadsafe.run_cases(["", "   ", '{"id": "E", "op": "extent", "shape": [2], "stride": [1]}']) == [
        {"id": "E", "extent": 2}
    ]
