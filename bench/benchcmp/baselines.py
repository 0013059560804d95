"""Stored baselines, bench/baselines/<kind>/<machine>/<binary>.json: the
machine's slug, finding the one to compare with, recording one, the thread
count one was recorded with, and warnings about contexts that differ."""

from __future__ import annotations

import json
import os
import re

from .results import Context


def slug(text: object) -> str:
    """Lower-case words joined by '-': "AMD EPYC 7B13" -> "amd-epyc-7b13"."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "unknown"


def machine_of(context: Context) -> str:
    """The machine a result was measured on, below its kind: the CPU model
    and, on x86, its family and model numbers (one name, such as "AMD EPYC",
    covers several generations on virtual machines), as a slug, plus "__" and
    the GPU model where the binary found one."""
    cpu = slug(" ".join(filter(None, (context.get("cpu_model", "unknown cpu"),
                                      context.get("cpu_id")))))
    if context.get("gpu_driver"):  # only present when a GPU was found
        return cpu + "__" + slug(str(context.get("gpu", "gpu")).split(" (")[0])
    return cpu


def describe_machine(context: Context) -> str:
    """"<CPU model> (<cpu id>), <GPU or 'no GPU'>", for messages."""
    gpu = context.get("gpu", "") if context.get("gpu_driver") else "no GPU"
    cpu = context.get("cpu_model", "unknown CPU")
    if context.get("cpu_id"):
        cpu += f" ({context['cpu_id']})"
    return f"{cpu}, {gpu}"


def baseline_path(baselines: str, kind: str, machine: str, binary_name: str) -> str:
    return os.path.join(baselines, kind, machine, binary_name + ".json")


def machines_with(baselines: str, kind: str, binary_name: str) -> list[str]:
    """The baselines of `binary_name` under <kind>/, one per machine, in the
    order of the machines' names."""
    kind_dir = os.path.join(baselines, kind)
    if not os.path.isdir(kind_dir):
        return []
    paths = [baseline_path(baselines, kind, m, binary_name) for m in sorted(os.listdir(kind_dir))]
    return [p for p in paths if os.path.isfile(p)]


def find_baseline(baselines: str, kind: str, machine: str,
                  binary_name: str) -> tuple[str | None, bool]:
    """(path, same_machine) of the stored baseline to compare with: this
    machine's, else another machine's of the same kind (for information),
    else (None, False)."""
    own = baseline_path(baselines, kind, machine, binary_name)
    if os.path.exists(own):
        return own, True
    others = machines_with(baselines, kind, binary_name)
    return (others[0], False) if others else (None, False)


def recorded_threads(baselines: str, kinds: list[str], binary_name: str) -> list[str]:
    """The OMP_NUM_THREADS each stored baseline of `binary_name` under the
    `kinds` was recorded with (its context's omp_env), where it names one."""
    found = []
    for kind in kinds:
        for path in machines_with(baselines, kind, binary_name):
            with open(path) as f:
                omp = json.load(f).get("context", {}).get("omp_env", "")
            m = re.search(r"OMP_NUM_THREADS=(\d+)", omp)
            if m:
                found.append(m.group(1))
    return found


def write_baseline(results_path: str, base_file: str, merge: bool,
                   kernel_dependent: tuple[str, ...] = ()) -> None:
    """Writes results_path as the baseline. With `merge` (a filtered run),
    replaces only the baseline's entries for the benchmarks it ran. The
    binary's path is kept as its name: a baseline names no machine's folders.

    A merge keeps one context, the run's. It raises ValueError, writing
    nothing, where that would relabel kept entries: the baseline's kernel
    differs from the run's and it keeps benchmarks whose names start with one
    of `kernel_dependent` (the binary's reloadsafe_kernel_dependent), which
    would then be judged as recorded under this kernel."""
    with open(results_path) as f:
        new = json.load(f)
    if merge and os.path.exists(base_file):
        with open(base_file) as f:
            old = json.load(f)
        def run_name(b: dict) -> str:
            return b.get("run_name", b["name"])

        names = {run_name(b) for b in new["benchmarks"]}
        kept = [b for b in old["benchmarks"] if run_name(b) not in names]
        old_ctx, new_ctx = old.get("context", {}), new.get("context", {})
        relabelled = sorted({run_name(b) for b in kept if run_name(b).startswith(tuple(kernel_dependent))})
        if relabelled and context_differs(old_ctx, new_ctx, "kernel"):
            raise ValueError(
                f"not merging into {os.path.basename(base_file)}: {len(relabelled)} kernel-dependent "
                f"benchmarks it keeps (e.g. {relabelled[0]}) were recorded under kernel "
                f"{old_ctx['kernel']!r}, and the merged file would say {new_ctx['kernel']!r}; record the "
                f"whole binary again (no --filter), or filter to every kernel-dependent benchmark")
        new["benchmarks"] = kept + new["benchmarks"]
    context = new.get("context", {})
    if "executable" in context:
        context["executable"] = os.path.basename(context["executable"])
    os.makedirs(os.path.dirname(base_file), exist_ok=True)
    with open(base_file, "w") as f:
        json.dump(new, f, indent=2)
        f.write("\n")


def context_differs(base_ctx: Context, cur_ctx: Context, key: str) -> bool:
    """Whether both contexts name `key` and name it differently (details in
    parentheses left out)."""
    b, c = base_ctx.get(key), cur_ctx.get(key)
    return b is not None and c is not None and str(b).split(" (")[0] != str(c).split(" (")[0]


def same_kernel(base_ctx: Context, cur_ctx: Context) -> bool:
    """Whether two contexts name the same kernel (or either names none)."""
    return not context_differs(base_ctx, cur_ctx, "kernel")


def check_context(base_ctx: Context, cur_ctx: Context) -> list[str]:
    """Warnings about results that should not be compared."""
    warnings = []
    if cur_ctx.get("reloadsafe_build", "opt") != "opt":
        warnings.append(f"this run's binary is not optimised ({cur_ctx['reloadsafe_build']}): "
                        f"build with -c opt")
    for key in ("cpu_model", "cpu_id", "gpu", "num_cpus", "kernel", "scratch_fs", "torch_threads"):
        if context_differs(base_ctx, cur_ctx, key):
            warnings.append(f"{key} differs from the baseline's: {cur_ctx[key]!r} vs {base_ctx[key]!r}")
    return warnings
