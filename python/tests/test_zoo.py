"""The bug zoo (python/tests/zoo): for every catalogue row, check_reload flags
the buggy layer by the name the upstream fix named, in both reload modes,
and passes the fixed layer; verdicts hold over an A -> B -> A checkpoint
cycle; the rows whose value check needs new weights miss it on a
same-weights reload. A row the checker cannot catch yet is a strict xfail
that names the missing capability."""
from __future__ import annotations

import difflib
import inspect
import pathlib
import re

import pytest
import torch

import reloadsafe
from reloadsafe import check_reload

import zoo
from zoo._layers import ab_cycle, default_checkpoints, same_weights

RELOADS = 4
VALUE_CHECKS = {"forward", "replay"}


def _check(bug, kind, reloads=RELOADS, **overrides):
    options = bug.check_options(kind)
    if "device_clean" in inspect.signature(check_reload).parameters:
        options["device_clean"] = True  # every pair must run as it is on a GPU too
    options.update(overrides)
    return check_reload(bug.layer(kind), bug.example_input, reloads=reloads, name=f"{bug.id} {kind}", **options)


def _not_caught_yet(bug):
    """A strict xfail while a capability the row needs is missing."""
    missing = bug.missing()
    if bug.gap and missing:
        return [pytest.mark.xfail(strict=True, raises=AssertionError,
                                  reason=f"not caught yet (missing: {', '.join(missing)}): {bug.gap}")]
    return []


def _params(bugs, marks=_not_caught_yet):
    return [pytest.param(b, id=b.id, marks=marks(b)) for b in bugs]


def _base_checkpoints(bug):
    return bug.options.get("make_checkpoint") or default_checkpoints(bug.buggy)


def test_the_zoo_covers_the_catalogue():
    assert len(zoo.BUGS) >= 25
    assert len({b.id for b in zoo.BUGS}) == len(zoo.BUGS)
    classes = {b.mechanism_class for b in zoo.BUGS}
    # Every primary class of the catalogue (H is only ever secondary there).
    assert classes >= set(zoo.MECHANISMS) - {"H"}, set(zoo.MECHANISMS) - classes
    for b in zoo.BUGS:
        assert re.fullmatch(r"Z\d\d", b.id) and re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", b.thread), b
        assert b.names and b.outcome in ("violation", "raises")
    assert sum(b.values_must_change for b in zoo.BUGS) >= 8


def _assert_buggy_is_flagged_by_the_upstream_name(bug, **overrides):
    report = _check(bug, "buggy", **overrides)
    assert not report.ok, report.table()
    if bug.outcome == "raises":
        assert zoo.raised_naming(report, bug.names), report.table()
        return
    for mode in reloadsafe.MODES:
        flagged = report.modes[mode]["flagged"]
        for name in bug.names:
            assert zoo.flags(flagged, name), (mode, name, report.table())


@pytest.mark.parametrize("bug", _params(zoo.BUGS))
def test_buggy_layer_is_flagged_by_the_upstream_name(bug):
    _assert_buggy_is_flagged_by_the_upstream_name(bug)


@pytest.mark.parametrize("bug", _params(zoo.BUGS, marks=lambda b: []))
def test_fixed_layer_passes(bug):
    report = _check(bug, "fixed")
    assert report.ok, report.table()
    for mode in reloadsafe.MODES:
        m = report.modes[mode]
        assert m["flagged"] == [] and "error" not in m and m["reloads_done"] == RELOADS, report.table()


def _not_caught_on_cuda(bug):
    if bug.cuda_gap:
        return [pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"not caught on CUDA: {bug.cuda_gap}")]
    return _not_caught_yet(bug)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False")
@pytest.mark.parametrize("bug", _params(zoo.BUGS, marks=_not_caught_on_cuda))
def test_cuda_pair_gets_the_cpu_verdict(bug):
    """On a GPU (the GPU check runs this), with the forward captured as a
    CUDA graph and replayed after every reload: the buggy layer is flagged
    by the same upstream name, and the fixed layer passes, graph replay
    included."""
    _assert_buggy_is_flagged_by_the_upstream_name(bug, device="cuda")
    fixed = _check(bug, "fixed", device="cuda")
    assert fixed.ok, fixed.table()


@pytest.mark.parametrize("bug", _params([b for b in zoo.BUGS if b.outcome == "violation"]))
def test_verdicts_hold_over_an_a_b_a_cycle(bug):
    """Checkpoints A, B, A, B, A: state refreshed by only one reload, or
    right only for the checkpoint it was first built from, shows."""
    cycle = ab_cycle(_base_checkpoints(bug))
    assert check_reload(bug.fixed, bug.example_input, reloads=4, make_checkpoint=cycle,
                        **{k: v for k, v in bug.check_options("fixed").items() if k != "make_checkpoint"}).ok
    report = check_reload(bug.buggy, bug.example_input, reloads=4, make_checkpoint=cycle,
                          **{k: v for k, v in bug.check_options("buggy").items() if k != "make_checkpoint"})
    assert not report.ok
    for name in bug.names:
        assert zoo.flags(report.flagged, name), (name, report.flagged)


def test_an_a_b_a_cycle_loads_a_then_b_then_a_again():
    bug = zoo.by_id("Z04")
    cycle = ab_cycle(_base_checkpoints(bug))
    a, b, a2 = (cycle(reloadsafe._C.reload_seed(1, r)) for r in range(3))
    assert all((a[k] == a2[k]).all() and not (a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize("bug", _params([b for b in zoo.BUGS if b.values_must_change], marks=lambda b: []))
def test_the_value_check_needs_new_weights(bug):
    """The stale read of these rows computes the right output when the
    reload brings the same weights: only a value-changing reload (the
    default) makes the forward or the replay differ from a cold load."""
    options = bug.check_options("buggy")
    options["make_checkpoint"] = same_weights(_base_checkpoints(bug))
    same = check_reload(bug.buggy, bug.example_input, reloads=RELOADS, **options)
    assert not VALUE_CHECKS & set(same.flagged), same.table()
    new = _check(bug, "buggy")
    assert VALUE_CHECKS & set(new.flagged), new.table()


def test_the_eager_fix_of_a_host_scale_is_still_a_graph_bug():
    """Z37's eager fix (ModelExpress #711, #783) refreshes the host float on
    every refit: the live forward is right, but a captured graph replays the
    number it baked in, and so does the capture's CPU replay."""
    from zoo.derived import HostKvScaleEagerFix

    bug = zoo.by_id("Z37")
    report = check_reload(HostKvScaleEagerFix, bug.example_input, reloads=RELOADS)
    assert not report.ok
    assert "replay" in report.flagged and "forward" not in report.flagged, report.table()
    if "host_numbers" in inspect.signature(check_reload).parameters:
        named = check_reload(HostKvScaleEagerFix, bug.example_input, reloads=RELOADS, host_numbers=True)
        assert "_k_scale_float" in named.flagged, named.table()


def test_docs_bug_zoo_md_is_what_the_zoo_gives_now():
    """docs/bug-zoo.md is generated (tools/gen_bug_zoo.sh): a row that
    changes verdict, or a pair added, makes it stale."""
    from zoo import table

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "bug-zoo.md"
    rows = [table.run(b) for b in zoo.BUGS]
    for row in rows:
        # The table and the tests agree on what is caught.
        assert row.caught == (not (row.bug.gap and row.bug.missing())), row.bug.id
        assert row.fixed_ok, row.bug.id
    have, want = doc.read_text(), table.render(rows)
    diff = "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(), "committed", "generated now",
                                          lineterm="", n=0))
    assert have == want, f"docs/bug-zoo.md is stale: run tools/gen_bug_zoo.sh\n{diff}"
