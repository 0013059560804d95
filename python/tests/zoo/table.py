"""docs/bug-zoo.md, generated from the zoo: every row checked now, and what
reloadsafe said.

    PYTHONPATH=<package_site>:python/tests python -m zoo.table docs/bug-zoo.md
    tools/gen_bug_zoo.sh            # the same, after building the package
    python -m zoo.table --devices cpu,cuda zoo_cuda.md   # CPU and GPU side by side

Writes the table (or prints it, without a path) and prints the check time of
each pair. test_zoo.py fails when the committed file differs from what this
produces. With ``--devices`` naming more than one device, every pair is
checked on each and the verdicts are put side by side (the GPU check's
``zoo`` part).
"""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

import reloadsafe
from reloadsafe import check_reload

from . import BUGS, MECHANISMS, Bug, flags, raised_naming
from ._layers import default_checkpoints, same_weights

RELOADS = 4
VALUE_WORDS = {
    "forward": "forward differs from a cold load",
    "replay": "replay of the capture differs from a cold load",
    "op sequence": "op sequence changed",
    "memory": "memory grew",
}

#: Catalogue rows with no pair here, and why.
NOT_RECREATED: dict[str, str] = {}


@dataclasses.dataclass
class Row:
    bug: Bug
    caught: bool
    reported: str  # what the report says on the buggy layer
    fixed_ok: bool
    same_weights: str  # what a same-weights reload of the buggy layer gives
    seconds: float  # both checks of the pair


# Which of address, storage and storage size a move changes depends on where
# the allocator puts the new storage: one word for all, so the table is the
# same on every run.
_MOVED = {"address": "moved", "storage": "moved", "storage resized or moved": "moved"}


def _kind(name: str) -> str:
    if " arg " in name:
        return "read"
    return "value" if name in VALUE_WORDS else "tensor"


def describe_report(report: reloadsafe.ReloadReport) -> str:
    """The buggy layer's report in its own words: each flagged tensor with
    the kinds of change listed for it, the first traced read, then the value
    checks."""
    whats: dict[str, list[str]] = {}
    for mode in report.modes.values():
        for v in mode["violations"]:
            seen = whats.setdefault(v["tensor"], [])
            what = _MOVED.get(v["what"], v["what"])
            if what not in seen:
                seen.append(what)
    flagged = report.flagged
    parts = []
    raised = [v for m in report.modes.values() for v in m["violations"] if v["tensor"] == "reload"]
    if raised:  # the reload raised (Note [A reload that raises]): what it raised says why
        after = raised[0]["after"].split(": every load")[0].split(": pass load=")[0]
        parts.append(f"reload {raised[0]['reload']} raises: {after}"[:300])
    for name in flagged:
        if _kind(name) == "tensor" and not name.endswith(" (view)") and name != "reload":
            kinds = whats.get(name)
            parts.append(f"`{name}`" + (f" ({', '.join(kinds)})" if kinds else ""))
    reads = [f for f in flagged if _kind(f) == "read"]
    if reads:
        more = f" and {len(reads) - 1} more reads" if len(reads) > 1 else ""
        parts.append(f"at `{reads[0]}`{more}")
    parts += [VALUE_WORDS[f] for f in flagged if _kind(f) == "value"]
    return "; ".join(parts) if parts else "nothing (ok)"


def _names_flagged(bug: Bug, report: reloadsafe.ReloadReport) -> bool:
    return not report.ok and all(
        flags(m["flagged"], n) for m in report.modes.values() for n in bug.names
    )


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"raises {type(e).__name__}: {text[0] if text else ''}"[:300]


def run(bug: Bug, device: str = "cpu", same_weights_too: bool = True) -> Row:
    """Checks both layers of ``bug`` on ``device``. A check that raises
    is reported in the row
    (``reported``, ``fixed_ok`` False), so one broken row does not stop
    the table."""
    start = time.perf_counter()
    caught = False
    try:
        report = check_reload(bug.buggy, bug.example_input, reloads=RELOADS, device=device,
                              **bug.check_options("buggy"))
        reported = describe_report(report)
        if bug.outcome == "raises":
            caught = raised_naming(report, bug.names)
        else:
            caught = _names_flagged(bug, report)
    except Exception as e:  # noqa: BLE001 - reported in the row
        reported = _first_line(e)
    try:
        fixed = check_reload(bug.fixed, bug.example_input, reloads=RELOADS, device=device,
                             **bug.check_options("fixed"))
        fixed_ok = fixed.ok
        if not fixed_ok:
            reported += f" / fixed layer: {describe_report(fixed)}"
    except Exception as e:  # noqa: BLE001 - reported in the row
        fixed_ok = False
        reported += f" / fixed layer {_first_line(e)}"
    seconds = time.perf_counter() - start
    same = "-"
    if bug.outcome == "violation" and same_weights_too:
        options = bug.check_options("buggy")
        options["make_checkpoint"] = same_weights(options.get("make_checkpoint") or default_checkpoints(bug.buggy))
        r = check_reload(bug.buggy, bug.example_input, reloads=RELOADS, device=device, **options)
        if r.ok:
            same = "passes"
        elif set(r.flagged) & {"forward", "replay"}:
            same = "caught, values too"
        else:
            same = "caught, no value check"
    return Row(bug, caught, reported, fixed_ok, same, seconds)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[Row]) -> str:
    caught = [r for r in rows if r.caught]
    fixed = [r for r in rows if r.fixed_ok]
    lines = [
        "# The bug zoo: reload bugs that shipped, re-created and checked",
        "",
        "<!-- Generated by `python -m zoo.table docs/bug-zoo.md` (tools/gen_bug_zoo.sh); do not edit. -->",
        "",
        "Each row is a reload bug from a public engine thread (the catalogue ids `Z01`..`Z38`), re-created as",
        "two plain-torch layers in `python/tests/zoo/`: the layer as it shipped and as its fix left it.",
        f"`check_reload` ran both, {RELOADS} value-changing reloads in each mode (normal and direct), on the CPU.",
        "A row is *caught* when the buggy layer's report names, in both modes, every tensor or attribute the",
        "upstream fix named (or the check stops with an error naming it).",
        "",
        f"**{len(caught)} of {len(rows)} caught by name; {len(fixed)} of {len(rows)} fixed layers pass.**",
        "",
        "Columns: *options* are the `check_reload` options the row needs beyond the defaults; *reported* is the buggy layer's report in its own words (each flagged tensor with what",
        "changed, the first traced read, then the value checks); *same weights* is what a reload of the same",
        "checkpoint gives the buggy layer (`passes`: only new values show the bug; `caught, no value check`:",
        "the address checks catch it, but the forward and the replay are right, as they were for the engine).",
        "",
        "| id | engine | thread | class | bug | options | reported on the buggy layer | caught | fixed | same weights | why not caught |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        b = r.bug
        why = "" if r.caught else (b.gap or "")
        used = ", ".join(f"`{k}`" for k in b.needs if k not in b.missing())
        lines.append(
            f"| {b.id} | {b.engine} | {b.thread} | {b.mechanism} | {_cell(b.title)} | {used} | {_cell(r.reported)} | "
            f"{'yes' if r.caught else 'no'} | {'passes' if r.fixed_ok else 'FAILS'} | {r.same_weights} | {_cell(why)} |"
        )
    lines += ["", "Mechanism classes:", ""]
    lines += [f"- **{k}**: {v}" for k, v in MECHANISMS.items()]
    if NOT_RECREATED:
        lines += ["", "Catalogue rows without a pair:", ""]
        lines += [f"- **{k}**: {v}" for k, v in NOT_RECREATED.items()]
    lines += [
        "",
        "Z15 and Z16 are bugs of vLLM's layerwise reload machinery (copy-back of buffers the load never",
        "wrote, and of a buffer aliasing a parameter). reloadsafe's utilities have no such copy-back (they",
        "refill, replace and move one tensor at a time), so here they are pairs, with the machinery as the",
        "load function. What the utilities do in the same situations is pinned by golden conformance cases",
        "in golden/layer_scripts.jsonl (listed in golden/FORMAT.md): L26 for Z15, L27-L29 for Z16 (L28, L29:",
        "refill_derived refuses a copy-back through an alias of a weight, whether or not it spans all of it).",
        "",
    ]
    return "\n".join(lines)


def render_devices(devices: list[str], rows: dict[str, list[Row]], header: str = "") -> str:
    """The pairs checked on several devices, side by side: a row per bug,
    for each device whether the buggy layer was caught by name and the
    fixed layer passed, and the report where a device's differs from the
    first device's."""
    first = devices[0]
    lines = ["# The bug zoo on " + " and ".join(devices), ""]
    if header:
        lines += [header, ""]
    for d in devices:
        caught = sum(r.caught for r in rows[d])
        fixed = sum(r.fixed_ok for r in rows[d])
        secs = sum(r.seconds for r in rows[d])
        lines.append(f"- **{d}**: {caught} of {len(rows[d])} caught by name; {fixed} of {len(rows[d])} fixed layers "
                     f"pass; {secs:.1f} s for all pairs")
    lines += ["", "| id | thread | " + " | ".join(f"{d} caught | {d} fixed" for d in devices) +
              f" | where a report differs from {first}'s |",
              "| --- | --- | " + " | ".join("--- | ---" for _ in devices) + " | --- |"]
    for i, bug in enumerate(rows[first]):
        b = bug.bug
        cells = []
        for d in devices:
            r = rows[d][i]
            cells += ["yes" if r.caught else "no", "passes" if r.fixed_ok else "FAILS"]
        diffs = [f"{d}: {_cell(rows[d][i].reported)}" for d in devices[1:] if rows[d][i].reported != bug.reported]
        if diffs:
            diffs.insert(0, f"{first}: {_cell(bug.reported)}")
        lines.append(f"| {b.id} | {b.thread} | " + " | ".join(cells) + " | " + "<br>".join(diffs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    devices = ["cpu"]
    if argv[:1] == ["--devices"] and len(argv) > 1:
        devices = [d for d in argv[1].split(",") if d]
        argv = argv[2:]
    if argv and argv[0].startswith("-"):
        print("usage: python -m zoo.table [--devices cpu,cuda] [FILE]", file=sys.stderr)
        return 2
    if "cuda" in devices and not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False; the zoo is not checked on cuda", file=sys.stderr)
        return 2
    by_device: dict[str, list[Row]] = {}
    for device in devices:
        rows = by_device[device] = []
        for bug in BUGS:
            row = run(bug, device, same_weights_too=len(devices) == 1)
            rows.append(row)
            print(f"{device:5} {bug.id}  {row.seconds:6.2f} s  {'caught' if row.caught else 'not caught'}"
                  f"{'' if row.fixed_ok else '  FIXED LAYER FAILS'}", file=sys.stderr, flush=True)
        print(f"{device:5} total  {sum(r.seconds for r in rows):6.2f} s (buggy and fixed checks, {RELOADS} reloads "
              "per mode)", file=sys.stderr)
    text = render(by_device["cpu"]) if devices == ["cpu"] else render_devices(devices, by_device)
    if argv:
        with open(argv[0], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if len(devices) > 1:
        # Side by side, a device that catches less than the first, or fails a
        # fixed layer, is a failure.
        base = by_device[devices[0]]
        bad = [f"{d} {r.bug.id}" for d in devices[1:] for i, r in enumerate(by_device[d])
               if not r.fixed_ok or (base[i].caught and not r.caught)]
        if bad:
            print("verdicts differ from " + devices[0] + "'s: " + ", ".join(bad), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
