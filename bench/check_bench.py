#!/usr/bin/env python3
"""What ``check_reload`` costs, against the layer's own work.

A backend author's suite calls ``check_reload`` for many layers, so one call
must cost little more than the loads, post-processings and forwards the
protocol makes anyway. On the FP8-style linear layer of README's example
(a bf16 checkpoint weight quantized to float8_e4m3fn into its own storage,
with a per-row scale refilled in place), at N x N for each size:

  BM_CheckReload/fp8_linear/traced/bytes:B/process_time    check_reload(..., reloads=10), both modes
  BM_CheckReload/fp8_linear/untraced/bytes:B/process_time  the same with trace=False
  BM_OwnWork/fp8_linear/bytes:B/process_time               20 x (new layer + load + post-processing
                                                        + forward): the work of as many reloads

and on a whole Hugging Face model (a tiny Llama built from its config,
reloaded with load_state_dict, the forward returning the logits; skipped
with its reason where transformers is missing):

  BM_CheckReload/hf_llama/traced/process_time    check_reload(..., reloads=10), both modes
  BM_CheckReload/hf_llama/untraced/process_time  the same with trace=False
  BM_OwnWork/hf_llama/process_time               20 x (build the model + load_state_dict + forward)

and on Llama-shaped models built from their configs at three sizes (5 M,
166 M and 551 M parameters: 20 MB, 634 MB and 2.1 GB in float32), against
the loop a user would run instead (SIZED; skipped with their reason where
transformers is missing):

  BM_CheckReload/llama_<size>/traced/process_time  check_reload(build, ids, load=load_state_dict,
                                                   reloads=4), both modes
  BM_UserLoop/llama_<size>/process_time            the model built once, its checkpoint a copy of
                                                   its state, a forward, then 4 x (checkpoint
                                                   changed, load_state_dict, forward)

each once per process, on torch's own thread count (as a user runs them), with
the process's peak resident memory (peak_rss_bytes in the JSON) and the
model's bytes (model_bytes, the loop's).

B is the checkpoint's bytes (2 N^2, bf16). Each benchmark runs in a fresh
process of its own (see run_in_fresh_process), on one thread, and is judged
by process CPU time (the JSON's cpu_time; real_time is the wall
clock), which other processes on a shared machine do not inflate: the
/process_time names tell bench/compare.py so. Targets (ratios within the run,
of medians over repetitions): check_reload traced <= 3 x its own work at
1024 x 1024, <= 2 x at 4096 x 4096, <= 2 x on the whole model; against the
user's loop, <= 5 x its time at 5 M parameters and <= 3 x at 166 M and 551 M,
and a peak memory at most one model's bytes above the loop's at every size.

It speaks enough of Google Benchmark's command line and JSON for
bench/compare.py (which runs it as it runs the C++ binaries: one repetition
per process, shuffled order) and bench/compare.py's targets:

  --benchmark_repetitions=N  --benchmark_enable_random_interleaving=true|false
  --benchmark_filter=REGEX   --benchmark_min_time=SECONDS (per benchmark, default 0.5:
                             a benchmark is repeated until it has used that much CPU time)
  --benchmark_out=FILE --benchmark_out_format=json   --benchmark_display_aggregates_only=...
  --reloadsafe_targets_out=FILE                      the targets as JSON
  --reloadsafe_sizes=1024,4096                       the layer sizes N
  --reloadsafe_models=hf_llama,llama_5m,llama_166m,llama_551m
                                                     the whole models (empty: none)
  --reloadsafe_context_binary=PATH                   prints the machine context (the
                                                     launcher passes //bench:machine_context)

Run through its Bazel launcher, which puts the package (//python:package) on
the path and uses the set-up's Python:

  bazel build -c opt //bench:check_bench && bazel-bin/bench/check_bench
  bench/compare.py check_bench
"""
import argparse
import datetime
import functools
import json
import os
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

import torch

import reloadsafe

RELOADS = 10  # check_reload's default; per mode
UNITS = 2 * RELOADS  # own-work units: one per reload of both modes
TARGETS = {1024: 3.0, 4096: 2.0}  # check_reload traced / own work, by N
MODEL_TARGET = 2.0  # check_reload traced / own work, on a whole model


class Fp8Linear(torch.nn.Module):
    """README's example layer, at any size."""

    def __init__(self, out_features=32, in_features=64):
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=torch.bfloat16), requires_grad=False)
        self.register_buffer("weight_scale", torch.ones(out_features, 1))

    def process_weights_after_loading(self):
        w = self.weight.float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
        fp8 = (w / scale).to(torch.float8_e4m3fn)
        self.weight.data = reloadsafe.in_own_storage(
            self.weight.detach(), fp8, whole_storage=reloadsafe.direct_reload_enabled())
        self.weight_scale.copy_(scale)

    def forward(self, x):
        w = self.weight.to(torch.float32) * self.weight_scale
        return torch.mm(x, w.t())


def factory(n):
    def make():
        return Fp8Linear(n, n)
    make.__name__ = f"Fp8Linear{n}"
    return make


def example_input(n):
    return torch.randn(8, n, generator=torch.Generator().manual_seed(3))


def check(n, trace):
    """One check_reload; an error unless it passes."""
    report = reloadsafe.check_reload(factory(n), example_input(n), reloads=RELOADS, trace=trace)
    if not report.ok:
        raise RuntimeError("check_reload did not pass:\n" + report.table())


def own_work(n, ckpt, x, units=UNITS):
    """`units` x (new layer + load + post-processing + forward), the steps
    check_reload's defaults run."""
    with torch.no_grad():
        for _ in range(units):
            layer = Fp8Linear(n, n)
            reloadsafe.load_checkpoint(layer, ckpt)
            layer.process_weights_after_loading()
            layer(x)


# --- a whole model ----------------------------------------------------------


def llama():
    """A tiny Llama (tied embeddings) from its config, weights from a fixed
    seed, in eval mode."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def model_ids():
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(3))


def model_load(model, ckpt):
    model.load_state_dict(ckpt, strict=False)


def model_forward(model, ids):
    return model(ids).logits


def check_model(trace):
    report = reloadsafe.check_reload(llama, model_ids(), load=model_load, forward=model_forward,
                                     reloads=RELOADS, trace=trace)
    if not report.ok:
        raise RuntimeError("check_reload did not pass:\n" + report.table())


def model_own_work(ckpt, ids, units=UNITS):
    """`units` x (build the model + load_state_dict + forward): what a plain
    loop of the loads and forwards a check stands for costs."""
    with torch.no_grad():
        for _ in range(units):
            model = llama()
            model_load(model, ckpt)
            model_forward(model, ids)


MODELS = ("hf_llama",)


def model_names(model):
    return [f"BM_CheckReload/{model}/traced/process_time",
            f"BM_CheckReload/{model}/untraced/process_time",
            f"BM_OwnWork/{model}/process_time"]


def model_benchmark(name):
    traced, untraced, own = model_names("hf_llama")
    if name == traced:
        return lambda: check_model(True)
    if name == untraced:
        return lambda: check_model(False)
    if name == own:
        ckpt = {n: torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
                for n, p in llama().named_parameters()}
        return functools.partial(model_own_work, ckpt, model_ids())
    raise ValueError(f"no benchmark {name!r}")


def model_warm_up():
    model_own_work({n: p.detach().clone() for n, p in llama().named_parameters()}, model_ids(), units=1)
    reloadsafe.check_reload(llama, model_ids(), load=model_load, forward=model_forward, reloads=1,
                            modes=("normal",))


# --- whole models at real size, against the user's own loop -----------------


#: Llama-shaped models built from their configs (random weights, no hub):
#: name -> (hidden, intermediate, layers, heads, key/value heads, vocabulary).
SIZED = {
    "llama_5m": (256, 768, 4, 4, 2, 4096),
    "llama_166m": (1024, 3072, 8, 16, 8, 32000),
    "llama_551m": (1536, 4608, 16, 16, 8, 32000),
}
SIZED_RELOADS = 4  # per mode: check_reload(..., reloads=4); the loop reloads 4 times
#: the check's time over the user's loop's, by model
SIZED_TIME_TARGETS = {"llama_5m": 5.0, "llama_166m": 3.0, "llama_551m": 3.0}
#: (the check's peak RSS - the loop's) / the model's parameter bytes
SIZED_MEMORY_TARGET = 1.0


def sized_names(model):
    return [f"BM_CheckReload/{model}/traced/process_time", f"BM_UserLoop/{model}/process_time"]


def sized_build(model):
    """A factory of `model` (SIZED): built from a fixed seed, in eval mode."""
    import transformers

    hidden, intermediate, layers, heads, kv_heads, vocab = SIZED[model]
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        tie_word_embeddings=False)

    def build():
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config).eval()

    return build


def sized_ids(model):
    vocab = SIZED[model][-1]
    return torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(3))


def user_loop(model):
    """What a user runs without the check: the model built once, its
    checkpoint a copy of its state, one forward, then SIZED_RELOADS times:
    every floating tensor of the checkpoint changed, load_state_dict,
    forward. Returns the model's parameter bytes."""
    model_fn, ids = sized_build(model), sized_ids(model)
    with torch.no_grad():
        m = model_fn()
        ckpt = {k: t.clone() for k, t in m.state_dict().items()}
        model_forward(m, ids)
        for _ in range(SIZED_RELOADS):
            for t in ckpt.values():
                if t.is_floating_point():
                    t.add_(0.001)
            model_load(m, ckpt)
            model_forward(m, ids)
    return sum(p.numel() * p.element_size() for p in m.parameters())


def sized_check(model):
    """check_reload of `model`, reloaded as the user's loop reloads it; an
    error unless it passes."""
    report = reloadsafe.check_reload(sized_build(model), sized_ids(model), load=model_load,
                                     forward=model_forward, reloads=SIZED_RELOADS)
    if not report.ok:
        raise RuntimeError("check_reload did not pass:\n" + report.table())


def sized_benchmark(name):
    """The function timed as the whole-model benchmark `name`, or None."""
    for model in SIZED:
        check, loop = sized_names(model)
        if name == check:
            return lambda: sized_check(model)
        if name == loop:
            return lambda: user_loop(model)
    return None


def timed(fn, min_time):
    """(iterations, real seconds per iteration, CPU seconds per iteration):
    `fn` repeated until it has used min_time CPU seconds (at least once)."""
    iterations, real, cpu = 0, 0.0, 0.0
    while iterations == 0 or cpu < min_time:
        r0, c0 = time.perf_counter(), time.process_time()
        fn()
        real += time.perf_counter() - r0
        cpu += time.process_time() - c0
        iterations += 1
    return iterations, real / iterations, cpu / iterations


def names(n):
    """The benchmarks of layer size n: check_reload traced, untraced, own work."""
    b = 2 * n * n
    return [f"BM_CheckReload/fp8_linear/traced/bytes:{b}/process_time",
            f"BM_CheckReload/fp8_linear/untraced/bytes:{b}/process_time",
            f"BM_OwnWork/fp8_linear/bytes:{b}/process_time"]


def benchmark(name, n):
    """The function timed as benchmark `name` of layer size n; its inputs
    are made here, outside the timing."""
    traced, untraced, own = names(n)
    if name == traced:
        return lambda: check(n, True)
    if name == untraced:
        return lambda: check(n, False)
    if name == own:
        ckpt = {"weight": torch.randn(n, n, generator=torch.Generator().manual_seed(1)).bfloat16()}
        return functools.partial(own_work, n, ckpt, example_input(n))
    raise ValueError(f"no benchmark {name!r} for size {n}")


def run_in_fresh_process(name, n, min_time):
    """timed() of benchmark `name` (of layer size `n`) in a new interpreter:
    run_one's result (iterations, real, cpu and, for a whole model at real
    size, peak_rss_bytes and model_bytes), or raises RuntimeError with the
    child's error.

    Each benchmark runs in a process of its own, because the heap remembers
    what ran before: once a check has grown glibc's heap, later allocations
    of 64 MiB are carved from memory already mapped instead of being mapped
    fresh, and the own work at 4096 x 4096 took 3.1 s after a check and 5.5 s
    before one, in the same process. A fresh process per benchmark measures
    each the way a plain process would run it, whatever order the shuffle
    chose."""
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f"--reloadsafe_run_one={name}",
         f"--reloadsafe_sizes={n}", f"--benchmark_min_time={min_time}"],
        capture_output=True, text=True, check=False)
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"the benchmark's process failed (exit {child.returncode}): "
                           + (child.stderr.strip().splitlines() or ["no output"])[-1])
    result = json.loads(lines[-1])
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def run_one(name, n, min_time):
    """The child's side of run_in_fresh_process: warm up, time `name`, print
    the result as one JSON line. A whole model at real size (SIZED) runs
    once, on torch's own thread count, as a user runs it, and reports the
    process's peak resident memory and the model's bytes too."""
    sized = sized_benchmark(name)
    if sized is None:
        torch.set_num_threads(1)
    try:
        if sized is not None:
            fn, min_time = sized, 0.0
            model_warm_up()  # the tiny model: torch's and transformers' first calls, little memory
        elif n == 0:  # a whole model
            fn = model_benchmark(name)
            model_warm_up()
        else:
            fn = benchmark(name, n)
            warm_up([n])
    except ImportError as e:  # transformers missing: the benchmark's error, with its reason
        print(json.dumps({"error": f"{name} needs transformers (tools/setup.sh installs it): {e}"}))
        return 0
    try:
        model_bytes = []
        iterations, real, cpu = timed(lambda: model_bytes.append(fn()), min_time)
        result = {"iterations": iterations, "real": real, "cpu": cpu}
        if sized is not None:
            result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            if model_bytes and model_bytes[-1]:
                result["model_bytes"] = model_bytes[-1]
        print(json.dumps(result))
    except Exception as e:  # reported by the parent as the benchmark's error
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    return 0


def warm_up(sizes):
    """What a process pays once, outside the timed runs (as the C++
    binaries calibrate dense_copy_ before any benchmark): dense_copy_'s
    crossover, the allocation census, first calls of the ops."""
    for n in sizes:
        ckpt = {"weight": torch.zeros(n, n, dtype=torch.bfloat16)}
        own_work(n, ckpt, example_input(n), units=1)
    n = min(sizes)
    reloadsafe.check_reload(factory(n), example_input(n), reloads=1, modes=("normal",))


def machine_context(binary):
    """The C++ binaries' machine context (bench/machine_context.h), from the
    helper binary, with this process's own thread count."""
    context = {}
    if binary:
        context = json.loads(subprocess.run([binary], check=True, capture_output=True,
                                            text=True).stdout)
    context["torch_threads"] = str(torch.get_num_threads())
    return context


def target_rows(medians, sizes):
    rows = []
    for n in sizes:
        if n not in TARGETS:
            continue
        b = 2 * n * n
        check_t = medians.get(f"BM_CheckReload/fp8_linear/traced/bytes:{b}/process_time")
        own = medians.get(f"BM_OwnWork/fp8_linear/bytes:{b}/process_time")
        if check_t is None or own is None:
            continue
        value = check_t / own
        rows.append({"description": f"check_reload traced / 20 x own work ({n} x {n})",
                     "bytes": b, "value": value, "bound": TARGETS[n], "comparison": "<=",
                     "unit": "ratio", "met": value <= TARGETS[n],
                     "benchmark": f"BM_CheckReload/fp8_linear/traced/bytes:{b}/process_time"})
    for model in MODELS:
        traced, _, own_name = model_names(model)
        check_t, own = medians.get(traced), medians.get(own_name)
        if check_t is None or own is None:
            continue
        value = check_t / own
        rows.append({"description": f"check_reload traced / 20 x own work ({model}, whole model)",
                     "bytes": 0, "value": value, "bound": MODEL_TARGET, "comparison": "<=",
                     "unit": "ratio", "met": value <= MODEL_TARGET, "benchmark": traced})
    return rows


def sized_target_rows(medians, peaks, model_bytes):
    """The whole models' targets: the check's time over the user's loop's,
    and the check's peak memory beyond the loop's in models' bytes."""
    rows = []
    for model in SIZED:
        check, loop = sized_names(model)
        if medians.get(check) and medians.get(loop):
            value = medians[check] / medians[loop]
            bound = SIZED_TIME_TARGETS[model]
            rows.append({"description": f"check_reload / the user's loop, time ({model}, {SIZED_RELOADS} reloads)",
                         "bytes": model_bytes.get(model, 0), "value": value, "bound": bound,
                         "comparison": "<=", "unit": "ratio", "met": value <= bound, "benchmark": check})
        if check in peaks and loop in peaks and model_bytes.get(model):
            value = (peaks[check] - peaks[loop]) / model_bytes[model]
            rows.append({"description": f"check_reload's peak memory beyond the user's loop's, in models ({model})",
                         "bytes": model_bytes[model], "value": value, "bound": SIZED_MEMORY_TARGET,
                         "comparison": "<=", "unit": "models", "met": value <= SIZED_MEMORY_TARGET,
                         "benchmark": check})
    return rows


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark_repetitions", type=int, default=1)
    p.add_argument("--benchmark_enable_random_interleaving", default="false")
    p.add_argument("--benchmark_display_aggregates_only", default="false")
    p.add_argument("--benchmark_filter", default="")
    p.add_argument("--benchmark_min_time", type=float, default=0.5)
    p.add_argument("--benchmark_out")
    p.add_argument("--benchmark_out_format", default="json", choices=["json"])
    p.add_argument("--reloadsafe_targets_out")
    p.add_argument("--reloadsafe_sizes", default="1024,4096")
    p.add_argument("--reloadsafe_models", default=",".join((*MODELS, *SIZED)))
    p.add_argument("--reloadsafe_context_binary")
    p.add_argument("--reloadsafe_executable", default="check_bench", help=argparse.SUPPRESS)
    p.add_argument("--reloadsafe_run_one", help=argparse.SUPPRESS)  # see run_in_fresh_process
    return p.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    sizes = [int(s) for s in args.reloadsafe_sizes.split(",") if s]
    if args.reloadsafe_run_one:
        return run_one(args.reloadsafe_run_one, sizes[0], args.benchmark_min_time)
    torch.set_num_threads(1)  # both sides of every ratio on one thread: steadier on a shared machine
    context = machine_context(args.reloadsafe_context_binary)
    context.update({
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": args.reloadsafe_executable,
        "num_cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()),
        "check_bench_reloads_per_mode": str(RELOADS),
        "check_bench_python": sys.version.split()[0],
        "torch_version": torch.__version__,
        "reloadsafe_references": ";".join(
            [f"BM_CheckReload/{layer}/{m}/=BM_OwnWork/{layer}/"
             for layer in ("fp8_linear", *MODELS) for m in ("traced", "untraced")]
            + [f"BM_CheckReload/{m}/traced/=BM_UserLoop/{m}/" for m in SIZED]),
        "check_bench_sized_reloads": str(SIZED_RELOADS),
    })
    models = [m for m in args.reloadsafe_models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS) - set(SIZED))
    if unknown:
        raise SystemExit(f"check_bench: unknown model(s) {unknown}; the models are "
                         f"{[*MODELS, *SIZED]}")
    candidates = [(name, n) for n in sizes for name in names(n)]
    for m in models:  # n == 0: a whole model
        candidates += [(name, 0) for name in (sized_names(m) if m in SIZED else model_names(m))]
    selected = [(name, n) for name, n in candidates
                if not args.benchmark_filter or re.search(args.benchmark_filter, name)]
    runs = [(name, n, rep) for rep in range(args.benchmark_repetitions) for name, n in selected]
    if args.benchmark_enable_random_interleaving.lower() in ("true", "1", "yes"):
        random.shuffle(runs)
    results = []
    for name, n, rep in runs:
        entry = {"name": name, "run_name": name, "run_type": "iteration",
                 "repetitions": args.benchmark_repetitions, "repetition_index": rep, "threads": 1,
                 "time_unit": "ms"}
        try:
            result = run_in_fresh_process(name, n, args.benchmark_min_time)
            real, cpu = result["real"], result["cpu"]
            entry.update(iterations=result["iterations"], real_time=real * 1e3, cpu_time=cpu * 1e3)
            memory = ""
            if "peak_rss_bytes" in result:  # a whole model at real size: its own threads
                entry.update(threads=torch.get_num_threads(), peak_rss_bytes=result["peak_rss_bytes"])
                memory = f" {result['peak_rss_bytes'] / 2**20:8.0f} MB peak"
                if "model_bytes" in result:
                    entry["model_bytes"] = result["model_bytes"]
            print(f"{name:<62} {real * 1e3:10.1f} ms real {cpu * 1e3:10.1f} ms CPU "
                  f"{result['iterations']:4d}{memory}", flush=True)
        except Exception as e:  # a failed check is the benchmark's error, as SkipWithError
            entry.update(iterations=0, real_time=0.0, cpu_time=0.0, error_occurred=True,
                         error_message=f"{type(e).__name__}: {e}")
            print(f"{name:<60} ERROR: {entry['error_message']}", flush=True)
        results.append(entry)

    medians, peaks = {}, {}
    for name, _ in selected:
        done = [r for r in results if r["name"] == name and not r.get("error_occurred")]
        if done:
            medians[name] = statistics.median(r["cpu_time"] for r in done)
        if any("peak_rss_bytes" in r for r in done):
            peaks[name] = statistics.median(r["peak_rss_bytes"] for r in done if "peak_rss_bytes" in r)
    model_bytes = {m: next(r["model_bytes"] for r in results if "model_bytes" in r and m in r["name"])
                   for m in SIZED if any("model_bytes" in r and m in r["name"] for r in results)}
    basis = (f"CPU time, medians of {args.benchmark_repetitions} repetitions, this run"
             if args.benchmark_repetitions > 1 else "CPU time, one run of each benchmark")
    targets = target_rows(medians, sizes) + sized_target_rows(medians, peaks, model_bytes)
    print(f"\nRatios ({basis}):")
    for n in sizes:
        b = 2 * n * n
        own = medians.get(f"BM_OwnWork/fp8_linear/bytes:{b}/process_time")
        for mode in ("traced", "untraced"):
            t = medians.get(f"BM_CheckReload/fp8_linear/{mode}/bytes:{b}/process_time")
            if own and t:
                print(f"  check_reload {mode:<8} / 20 x own work, {n} x {n}: {t / own:.2f}")
    for model in models:
        own = medians.get(f"BM_OwnWork/{model}/process_time")
        for mode in ("traced", "untraced"):
            t = medians.get(f"BM_CheckReload/{model}/{mode}/process_time")
            if own and t:
                print(f"  check_reload {mode:<8} / 20 x own work, {model}: {t / own:.2f}")
    for model in models:
        if model not in SIZED:
            continue
        check, loop = sized_names(model)
        if medians.get(check) and medians.get(loop):
            line = f"  check_reload / the user's loop, {model}: time {medians[check] / medians[loop]:.2f}"
            if check in peaks and loop in peaks and model_bytes.get(model):
                extra = peaks[check] - peaks[loop]
                line += (f", peak memory {peaks[check] / 2**20:.0f} MB against {peaks[loop] / 2**20:.0f} MB "
                         f"(+{extra / 2**20:.0f} MB, {extra / model_bytes[model]:.2f} x the model's "
                         f"{model_bytes[model] / 2**20:.0f} MB)")
            print(line)
    print(f"\nTargets ({basis}):")
    for t in targets:
        print(f"  {'met' if t['met'] else 'MISSED':<7} {t['value']:10.2f}  <= {t['bound']:.2f}  "
              f"{t['description']}")
    print(f"  {sum(t['met'] for t in targets)} of {len(targets)} met")

    if args.benchmark_out:
        with open(args.benchmark_out, "w") as f:
            json.dump({"context": context, "benchmarks": results}, f, indent=1)
    if args.reloadsafe_targets_out:
        with open(args.reloadsafe_targets_out, "w") as f:
            json.dump({"basis": basis, "targets": targets}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
