#!/usr/bin/env python3
"""The C++ include graph, held to the layer order of conformance/README.md.

    tools/include_layers.py              # from the top of a checkout: every file of ROOTS
    tools/include_layers.py FILE...      # those files (paths from the top of the checkout)

Prints one line per finding and exits 1 if there is any; //tools:include_layers_test
runs it over the tree (and shows, on planted trees, that each finding fires).

The layers, bottom up, each depending only on those it names below it:

    utils/  <-  conformance/ (cases)
    utils/  <-  conformance/trace/  <-  conformance/harness/  <-  python/src/

and the harness in the layers its BUILD file draws: subject (the subject
interface, a run's options, a layer's state), report, layer life, steps,
protocol, harness (C++ backends as subjects), then what is built on all of
it: backends/, the commands and the tests. The capture (and the trace's
tests) is a layer of its own above the rest of the trace, so that only the
protocol and above may include it: the subject interface names a layer's
tensors with the leaf named_tensor.h. Every C++ file under ROOTS belongs to
exactly one layer of LAYERS (a new file is given one there). A finding is:

  - an include of a header from a layer that is not the file's own or below
    it: above it, or beside it (the cases and the trace know nothing of each
    other);
  - an include of a header under a folder's internal/ from a file outside
    that folder (abseil's convention: internal/ is for the folder's own
    files; Bazel's visibility alone cannot see an include that a transitive
    dependency makes compile);
  - a cycle of includes;
  - a file of no layer, or of two;
  - an include of a path under ROOTS that is not among the files checked.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys

# The folders whose C++ files are checked.
ROOTS = ("utils/", "conformance/", "python/src/")
# What counts as a C++ file.
EXTENSIONS = (".h", ".cc", ".inc")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Layer:
    """A set of files (glob patterns: `*` within a folder, `**/` across
    folders; a pattern that starts with `!` takes files out) and the layers
    directly below it, whose headers it may include (and theirs,
    transitively)."""

    name: str
    patterns: tuple[str, ...]
    below: tuple[str, ...] = ()


_H = "conformance/harness/"
LAYERS = (
    Layer("utils", ("utils/*",)),
    Layer("cases", ("conformance/*", "conformance/ops/*"), below=("utils",)),
    Layer("trace", ("conformance/trace/**/*", "!conformance/trace/capture.*",
                    "!conformance/trace/**/*_test.cc"), below=("utils",)),
    Layer("trace: capture", ("conformance/trace/capture.*", "conformance/trace/**/*_test.cc"),
          below=("trace",)),
    Layer(
        "harness: subject",
        tuple(_H + f for f in ("subject.h", "run_options.h", "layer_state.*", "internal/all_close.*")),
        below=("trace",),
    ),
    Layer("harness: report",
          tuple(_H + f for f in ("report.*", "report_format.*", "violation_sink.*")),
          below=("harness: subject",)),
    Layer("harness: layer life", (_H + "layer_life.*",), below=("harness: report",)),
    Layer(
        "harness: steps",
        tuple(_H + f for f in ("step.h", "step_table.*", "reload_steps.*", "steps/*"))
        + ("!" + _H + "steps/*_test.cc",),
        below=("harness: layer life",),
    ),
    Layer(
        "harness: protocol",
        tuple(_H + f for f in ("protocol.*", "checkpoint_pools.*", "values.*", "cold_loads.*", "cold_start.*",
                               "device_graph.*", "device_graph_cuda.cc", "forward_capture.*",
                               "forward_checks.*", "mode_memory.*", "digest.*",
                               "internal/parallel_items.h")),
        below=("harness: steps", "trace: capture"),
    ),
    Layer("harness: harness", tuple(_H + f for f in ("backend.*", "harness.*", "module_cache.*")),
          below=("harness: protocol",)),
    Layer(
        "harness: backends, commands, tests",
        tuple(_H + f for f in ("backends/*", "run_flags.*", "*_main.cc", "**/*_test.cc",
                               "example_consumer/*")),
        below=("harness: harness",),
    ),
    Layer("python", ("python/src/*",), below=("harness: harness", "cases")),
)


def _regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


_MATCHERS = [
    (layer, [_regex(p) for p in layer.patterns if not p.startswith("!")],
     [_regex(p[1:]) for p in layer.patterns if p.startswith("!")])
    for layer in LAYERS
]


def layers_of(path: str) -> list[str]:
    """The names of the layers whose patterns take `path`."""
    return [layer.name for layer, take, leave in _MATCHERS
            if any(r.match(path) for r in take) and not any(r.match(path) for r in leave)]


def _allowed() -> dict[str, set[str]]:
    """Each layer's own name and every layer below it, transitively."""
    by_name = {layer.name: layer for layer in LAYERS}
    allowed: dict[str, set[str]] = {}

    def below(name: str) -> set[str]:
        if name not in allowed:
            allowed[name] = {name}
            for lower in by_name[name].below:
                allowed[name] |= below(lower)
        return allowed[name]

    for layer in LAYERS:
        below(layer.name)
    return allowed


def includes(text: str) -> list[str]:
    """The quoted includes of a C++ file, in order."""
    return _INCLUDE.findall(text)


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every cycle a depth-first search finds (one per back edge), each as
    the files along it, starting with its smallest path."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):]
                start = cycle.index(min(cycle))
                found.append(cycle[start:] + cycle[:start])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    unique: list[list[str]] = []
    for cycle in found:
        if cycle not in unique:
            unique.append(cycle)
    return unique


def check(files: dict[str, str]) -> list[str]:
    """The findings on `files` (path from the top of the checkout -> text),
    one line each; empty when the include graph keeps the layer order."""
    findings: list[str] = []
    allowed = _allowed()
    layer: dict[str, str] = {}
    for path in sorted(files):
        names = layers_of(path)
        if len(names) != 1:
            findings.append(f"{path}: in {'no layer' if not names else 'layers ' + ', '.join(names)}: "
                            "give it exactly one in tools/include_layers.py's LAYERS")
        else:
            layer[path] = names[0]
    graph: dict[str, list[str]] = {}
    for path in sorted(files):
        edges = graph.setdefault(path, [])
        for inc in includes(files[path]):
            if not inc.startswith(ROOTS):
                continue
            if inc not in files:
                findings.append(f"{path}: includes {inc}, which is not among the files checked")
                continue
            edges.append(inc)
            if "/internal/" in inc:
                owner = inc[:inc.index("/internal/") + 1]
                if not path.startswith(owner):
                    findings.append(f"{path}: includes {inc}, internal to {owner}")
            if path in layer and inc in layer and layer[inc] not in allowed[layer[path]]:
                findings.append(f"{path} ({layer[path]}) includes {inc} ({layer[inc]}), "
                                "which is not below it")
    for cycle in _cycles(graph):
        findings.append("include cycle: " + " -> ".join(cycle + cycle[:1]))
    return findings


def _tree(top: str) -> list[str]:
    paths = []
    for root in ROOTS:
        for folder, dirs, names in os.walk(os.path.join(top, root)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("bazel-", ".")))
            for name in sorted(names):
                if name.endswith(EXTENSIONS):
                    paths.append(os.path.relpath(os.path.join(folder, name), top))
    return paths


def read(paths: list[str], top: str = ".") -> dict[str, str]:
    """The C++ files among `paths` (relative to `top`), read."""
    files = {}
    for path in paths:
        if path.endswith(EXTENSIONS):
            with open(os.path.join(top, path), encoding="utf-8") as f:
                files[path] = f.read()
    return files


def main(argv: list[str]) -> int:
    files = read(argv or _tree("."))
    findings = check(files)
    for line in findings:
        print(line)
    if findings:
        print(f"include_layers: {len(findings)} finding(s) in {len(files)} files "
              "(conformance/README.md has the layer order)")
        return 1
    print(f"include_layers: {len(files)} files keep the layer order, no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
