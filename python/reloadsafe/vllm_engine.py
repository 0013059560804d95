"""Checking a whole vLLM engine's weight syncs: ``check_engine``.

RL frameworks push a trainer's weights into a running engine through
``LLM.collective_rpc("reload_weights", ...)`` (vLLM's layerwise reload:
each layer's tensors are buffered, loaded into fresh tensors, post-processed
and copied into the tensors the layer had) or through a worker extension
calling the model runner. What breaks ships in that machinery, over a whole
model: a layer finalized before all its tensors arrived, a tensor two
modules share loaded into one of them, an expert map left stale, names that
match no parameter. ``check_engine`` checks a sync the way a CUDA graph and
a fresh engine would see it::

    import os
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
    from vllm import LLM
    from reloadsafe.vllm import check_engine, reload_from_iterator

    llm = LLM(model=path, enforce_eager=True, skip_tokenizer_init=True)
    report = check_engine(llm, reload_from_iterator, reloads=2)
    assert report.ok, report.format()

What it does, in order:

1. a warm-up step, then the capture: one generate (a prefill and a decode)
   with every call of the model's ``forward`` and ``compute_logits`` traced
   (``reloadsafe.trace``: every op and every tensor it reads, at which
   address), and a second, the control. A read is *held* (what a captured
   graph bakes in) when its storage existed before the step began (on the
   CPU, by its allocation epoch: not made by the runner around the forward)
   and the control reads it at the same address; the others are the step's
   own inputs (metadata, positions);
2. per reload ``k``: a checkpoint with new values, drawn from the model's
   own safetensors files (same names, shapes and dtypes) and written beside
   the model's configuration (``EngineCheckpoint``), handed to ``sync``;
   then the same generate, traced and recorded module by module;
3. the verdict of each reload, against the capture and against a fresh
   engine built from the same checkpoint (in a subprocess, one engine per
   checkpoint):

   - every parameter and buffer at its captured address and layout; another
     tensor reachable from the model (``named_tensors``: attributes,
     closures) that moved is listed, and is a violation where a held read
     reads it (Note [Reads compared are a replay]);
   - every held read of the capture made again, by the same op, at the same
     address, the tensor named where the model reaches it;
   - every parameter's and buffer's bytes those of the fresh engine (what a
     graph replays, whether or not the prompt reaches it): one that kept its
     bytes was not loaded; for stacked experts, the experts that differ and
     whose weights they hold;
   - every module's output the fresh engine's, the first that is not named
     (with "kept its output from before the sync" where nothing loaded it);
   - the tensor bytes the process holds not growing by a checkpoint per
     reload.

The CPU platform rebuilds each linear layer's kernel state on every
post-processing (a oneDNN handle or a packed weight in the layer's
``cpu_linear`` closure; a CPU engine captures no graphs): on the CPU those
are left out of the address checks, named in ``EngineReport.exempt``, and
still compared by value.

vLLM is imported where it is used, never by ``import reloadsafe``. Tried on
vLLM 0.32's CPU build (python/tests/vllm_cpu); the engine of vLLM 0.33's
CUDA wheel cannot run without a GPU and was not.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import gc
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._loader import _C
from .errors import ReloadCheckError, ReloadViolation
from .trace import TensorRead, Trace, trace
from .walk import named_tensors

__all__ = [
    "EngineCheckpoint",
    "EngineReload",
    "EngineReport",
    "check_engine",
    "engine_args_of",
    "model_runner_of",
    "reload_from_checkpoint",
    "reload_from_iterator",
    "reload_streamed",
]

#: Each phase of a check as it starts (INFO), for a long check's progress.
_log = logging.getLogger("reloadsafe.vllm_engine")

#: The token ids of the check's prompt (any model with 16 or more tokens in
#: its vocabulary takes them).
DEFAULT_PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5)

#: Names the CPU platform rebuilds on every post-processing: a linear layer's
#: ``cpu_linear`` closure (a oneDNN handle or a packed weight) and a causal
#: convolution's unpacked copy. A CPU engine captures no graphs.
CPU_PLATFORM_REBUILDS = ("*.cpu_linear.*", "*._cpu_unpacked_conv_weight")

#: Files of a model folder that hold weights (not copied beside a checkpoint).
_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.pt", "*.pth")


# ---------------------------------------------------------------------------
# Checkpoints and the syncs RL frameworks make


@dataclasses.dataclass(frozen=True)
class EngineCheckpoint:
    """New weights for the engine's model: the tensors of the model's own
    safetensors files, with new values, by their names in those files."""

    seed: int
    #: A folder with the model's configuration files and ``model.safetensors``
    #: holding these tensors: what ``reload_weights(weights_path=...)`` and a
    #: fresh engine read.
    path: str
    tensors: dict[str, torch.Tensor]

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) in the files' order, what ``weights_iterator`` takes."""
        return list(self.tensors.items())

    def chunks(self, count: int) -> list[list[tuple[str, torch.Tensor]]]:
        """The items in ``count`` consecutive parts of about equal length, in
        the files' order (a part may end inside a layer)."""
        if count < 1:
            raise ReloadCheckError(f"EngineCheckpoint.chunks: count must be at least 1, got {count}")
        items = self.items()
        step = -(-len(items) // count)
        return [items[i:i + step] for i in range(0, len(items), step)]

    @property
    def nbytes(self) -> int:
        """The bytes of the checkpoint's tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


#: A sync: pushes a checkpoint into the engine, the way the code under test does.
Sync = Callable[[Any, EngineCheckpoint], None]


def reload_from_checkpoint(llm: Any, checkpoint: EngineCheckpoint) -> None:
    """``collective_rpc("reload_weights", weights_path=...)``: the engine
    reads the checkpoint's folder."""
    llm.collective_rpc("reload_weights", kwargs={"weights_path": checkpoint.path})


def reload_from_iterator(llm: Any, checkpoint: EngineCheckpoint) -> None:
    """``collective_rpc("reload_weights", weights_iterator=...)`` with the
    whole checkpoint in one call."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": checkpoint.items()})


def reload_streamed(chunks: int) -> Sync:
    """A sync that sends the checkpoint in ``chunks`` parts through one
    ``reload_weights`` call (a generator the engine draws the parts from, as
    a trainer streams buckets): one reload, finalized once at its end."""

    def sync(llm: Any, checkpoint: EngineCheckpoint) -> None:
        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for part in checkpoint.chunks(chunks):
                yield from part

        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})

    sync.__name__ = f"reload_streamed({chunks})"
    return sync


# ---------------------------------------------------------------------------
# The engine's parts


def model_runner_of(llm: Any) -> Any:
    """The model runner of an ``LLM`` whose engine runs in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank)."""
    engine = getattr(llm, "llm_engine", None)
    client = getattr(engine, "engine_core", None)
    core = getattr(client, "engine_core", None)
    executor = getattr(core, "model_executor", None)
    wrapper = getattr(executor, "driver_worker", None)
    worker = getattr(wrapper, "worker", wrapper)
    runner = getattr(worker, "model_runner", None)
    if runner is None or not isinstance(getattr(runner, "model", None), torch.nn.Module):
        raise ReloadCheckError(
            "check_engine: found no model runner in this process behind the LLM "
            f"({type(client).__name__} engine client): the check traces the model's forward where it "
            "runs. Set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the LLM, with one rank "
            "(tensor_parallel_size=1)")
    return runner


def engine_args_of(llm: Any) -> dict[str, Any]:
    """The ``LLM(...)`` arguments that build an engine like ``llm`` (its
    model folder aside): what the fresh engines of ``check_engine`` get."""
    config = llm.llm_engine.vllm_config
    model = config.model_config
    args: dict[str, Any] = {
        "dtype": str(model.dtype).removeprefix("torch."),
        "max_model_len": model.max_model_len,
        "enforce_eager": model.enforce_eager,
        "seed": model.seed,
        "skip_tokenizer_init": model.skip_tokenizer_init,
        "trust_remote_code": model.trust_remote_code,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
    }
    if model.quantization is not None:
        args["quantization"] = model.quantization
    return args


def _model_folder(llm: Any) -> str:
    folder = llm.llm_engine.vllm_config.model_config.model
    if not os.path.isdir(folder):
        raise ReloadCheckError(
            f"check_engine: the engine's model {folder!r} is not a local folder: checkpoints are "
            "drawn from the model's own safetensors files (download it and build the LLM on the folder)")
    return folder


def _weight_files(folder: str) -> list[str]:
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ReloadCheckError(f"check_engine: no .safetensors file in the model folder {folder!r}")
    return [os.path.join(folder, f) for f in files]


def _draw_checkpoint(folder: str, seed: int, out: str) -> EngineCheckpoint:
    """New values for every tensor of the model's files, about the scale of
    the old ones, written with the folder's other files to ``out``."""
    from safetensors.torch import load_file, save_file

    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(folder):
        for name, old in load_file(path).items():
            if not old.is_floating_point():
                tensors[name] = old.clone()
                continue
            g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
            wide = old.to(torch.float32)
            new = wide * (1 + 0.25 * torch.randn(wide.shape, generator=g)) \
                + 0.02 * torch.randn(wide.shape, generator=g)
            tensors[name] = new.to(old.dtype)
    os.makedirs(out, exist_ok=True)
    for entry in os.listdir(folder):
        source = os.path.join(folder, entry)
        if os.path.isfile(source) and not any(fnmatch.fnmatch(entry, p) for p in _WEIGHT_FILES):
            shutil.copy(source, os.path.join(out, entry))
    save_file(tensors, os.path.join(out, "model.safetensors"))
    return EngineCheckpoint(seed=seed, path=out, tensors=tensors)


# ---------------------------------------------------------------------------
# One step of the engine, traced and recorded


@dataclasses.dataclass
class _Step:
    """What one generate showed: the traces of the model's calls (forward,
    compute_logits, in call order), each module's output in call order, the
    prompt's log-probabilities and the tokens generated."""

    traces: list[Trace]
    outputs: list[tuple[str, torch.Tensor]]
    logprobs: list[float]
    tokens: list[int]
    #: The CPU allocation epoch at the step's start: a storage with a later
    #: one was made by the step (TensorRead.allocation_epoch).
    start_epoch: int = 0
    #: A digest of each parameter's and buffer's bytes after the step (the
    #: fresh engines': what a first load leaves in them).
    digests: dict[str, str] = dataclasses.field(default_factory=dict)


def _has_bytes(t: torch.Tensor) -> bool:
    """A tensor whose bytes are its own storage's: a plain tensor or
    parameter, or a subclass that only adds Python (vLLM's parameter classes
    with their loaders), not a wrapper that dispatches to inner tensors, not
    meta."""
    if t.is_meta or is_traceable_wrapper_subclass(t):
        return False
    try:
        return t.untyped_storage().data_ptr() != 0 or t.numel() == 0
    except (RuntimeError, NotImplementedError):
        return False


def _digests(model: torch.nn.Module) -> dict[str, str]:
    """A digest of the bytes of every parameter and buffer, by name:
    ``"dtype[shape]:digest"``, and for a stacked tensor (three or more
    dimensions: experts, heads) ``"|"`` and a short digest per slice along
    its first dimension, to tell which expert differs."""
    out = {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in named:
        if not _has_bytes(t):
            continue
        flat = t.detach().cpu().contiguous()
        digest = hashlib.blake2b(_raw(flat), digest_size=16).hexdigest()
        out[name] = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}:{digest}"
        if t.dim() >= 3 and t.shape[0] > 1:
            out[name] += "|" + ",".join(hashlib.blake2b(_raw(flat[i]), digest_size=6).hexdigest()
                                        for i in range(t.shape[0]))
    return out


def _meta_tensors(model: torch.nn.Module) -> int:
    """How many parameters and buffers are on the meta device (vLLM's
    layerwise reload puts a layer's there until its tensors are loaded)."""
    return sum(1 for t in (*model.parameters(), *model.buffers()) if t.is_meta)


def _raw(t: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, as a buffer (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _run_step(llm: Any, model: torch.nn.Module, prompt: Sequence[int], *, traced: bool) -> _Step:
    from vllm.sampling_params import SamplingParams

    step = _Step([], [], [], [])

    def recorder(name: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is None or tensor.is_meta:
                return
            _C.begin_untraced()
            try:
                step.outputs.append((name, tensor.detach().to(torch.float32, copy=True)))
            finally:
                _C.end_untraced()

        return record

    def wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not traced:
                return original(*args, **kwargs)
            with trace() as t:
                result = original(*args, **kwargs)
            step.traces.append(t)
            return result

        return call

    handles = [m.register_forward_hook(recorder(n)) for n, m in model.named_modules() if n]
    patched = [a for a in ("forward", "compute_logits") if hasattr(model, a)]
    # What the instance itself held under those names (a wrapper of someone
    # else's), put back at the end; absent ones are deleted again.
    own = {a: model.__dict__[a] for a in patched if a in model.__dict__}
    for attribute in patched:
        setattr(model, attribute, wrapped(getattr(model, attribute)))
    try:
        llm.reset_prefix_cache()
        # ignore_eos: every step makes the same model calls, whatever token
        # the weights of a reload pick (a fresh engine's too).
        params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                ignore_eos=True)
        with _C.CpuCensus():
            step.start_epoch = _C.cpu_allocation_epoch() or 0
            out = llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)[0]
    finally:
        for attribute in patched:
            if attribute in own:
                setattr(model, attribute, own[attribute])
            else:
                delattr(model, attribute)
        for handle in handles:
            handle.remove()
    for position, entry in enumerate(out.prompt_logprobs or []):
        if entry is not None:
            step.logprobs.append(float(entry[prompt[position]].logprob))
    step.tokens = [int(t) for t in out.outputs[0].token_ids]
    return step


# ---------------------------------------------------------------------------
# Fresh engines, one per checkpoint, in a subprocess


def _fresh_steps(engine_args: dict[str, Any], checkpoints: Sequence[EngineCheckpoint],
                 prompt: Sequence[int], workdir: str, timeout: float) -> list[_Step]:
    request = os.path.join(workdir, "fresh-request.json")
    result = os.path.join(workdir, "fresh-result.pt")
    with open(request, "w") as f:
        json.dump({"engine_args": engine_args, "folders": [c.path for c in checkpoints],
                   "prompt": list(prompt), "out": result}, f)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    try:
        done = subprocess.run([sys.executable, "-m", "reloadsafe.vllm_engine", request], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ReloadCheckError(
            f"check_engine: the fresh engines did not finish within {timeout:.0f} s "
            f"(fresh_timeout=); the end of their output:\n{_tail(e.stderr)}") from None
    if done.returncode != 0:
        raise ReloadCheckError(
            f"check_engine: building a fresh engine from the checkpoint failed (exit status "
            f"{done.returncode}), with the arguments {engine_args} (engine_args= to change them); "
            f"the end of its output:\n{_tail(done.stderr)}")
    steps = torch.load(result, weights_only=False)
    return [_Step([], list(s["outputs"]), list(s["logprobs"]), list(s["tokens"]), digests=dict(s["digests"]))
            for s in steps]


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def _fresh_main(request_path: str) -> None:
    """The subprocess of ``_fresh_steps``: an engine per folder, one step each."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.entrypoints.llm import LLM

    with open(request_path) as f:
        request = json.load(f)
    steps = []
    for folder in request["folders"]:
        llm = LLM(model=folder, **request["engine_args"])
        model = model_runner_of(llm).model
        _run_step(llm, model, request["prompt"], traced=False)  # the same warm-up as the checked engine
        step = _run_step(llm, model, request["prompt"], traced=False)
        steps.append({"outputs": step.outputs, "logprobs": step.logprobs, "tokens": step.tokens,
                      "digests": _digests(model)})
        del llm, model
        cleanup_dist_env_and_memory()
        gc.collect()
    torch.save(steps, request["out"])


# ---------------------------------------------------------------------------
# The verdicts


@dataclasses.dataclass(frozen=True)
class EngineReload:
    """One reload's findings; ``violations`` is empty when it kept every
    promise."""

    reload: int
    seed: int
    violations: tuple[str, ...]
    #: Largest difference of the prompt's log-probabilities from the fresh engine's.
    logprob_difference: float
    #: Tensor bytes the process's Python objects reach after the reload (the
    #: check's own checkpoint aside).
    tensor_bytes: int
    #: Tensors reachable from the model, neither parameter nor buffer, that
    #: the sync moved and the step does not read (a host-side copy of a
    #: scale): not a violation, listed.
    moved_unread: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class EngineReport:
    """``check_engine``'s verdict on one sync."""

    name: str
    model: str
    reloads: tuple[EngineReload, ...]
    #: Reads of the capture held to their address (a graph bakes them in).
    held_reads: int
    #: Reads whose address changed between two steps without a sync: the
    #: step's own inputs, not held.
    per_step_reads: int
    #: Names left out of the address checks (patterns of ``exempt``, the
    #: CPU platform's rebuilds), still compared by value.
    exempt: tuple[str, ...]
    #: Violations of the whole check (memory growth over the reloads).
    overall: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.overall and all(not r.violations for r in self.reloads)

    def violations(self) -> list[str]:
        """Every violation, each prefixed with its reload."""
        out = [f"reload {r.reload}: {v}" for r in self.reloads for v in r.violations]
        return out + list(self.overall)

    def format(self) -> str:
        """The verdict and its reasons, a few lines per reload."""
        head = (f"{self.name} on {self.model}: {'ok' if self.ok else 'VIOLATION'} "
                f"({len(self.reloads)} reloads; {self.held_reads} reads held to their address, "
                f"{self.per_step_reads} per-step reads not held)")
        lines = [head]
        for r in self.reloads:
            lines.append(f"  reload {r.reload} (seed {r.seed}): "
                         f"{'ok' if not r.violations else 'VIOLATION'}; prompt log-probabilities "
                         f"within {r.logprob_difference:.3g} of a fresh engine's; "
                         f"{r.tensor_bytes / 2**20:.1f} MiB of tensors held")
            lines += [f"    - {v}" for v in r.violations]
            if r.moved_unread:
                lines.append(f"    moved, not read by the step ({len(r.moved_unread)}): "
                             + ", ".join(r.moved_unread[:4]) + (" ..." if len(r.moved_unread) > 4 else ""))
        lines += [f"  - {v}" for v in self.overall]
        if self.exempt:
            lines.append(f"  not held to their address ({len(self.exempt)}): "
                         + ", ".join(self.exempt[:6]) + (" ..." if len(self.exempt) > 6 else ""))
        return "\n".join(lines)

    def raise_for_violations(self) -> None:
        """Raises ``ReloadViolation`` (an AssertionError) with ``format()``
        when the report is not ok."""
        if not self.ok:
            raise ReloadViolation(self.format(), self)


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.storage_offset())


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


@dataclasses.dataclass(frozen=True)
class _Held:
    data_ptr: int
    layout: tuple[Any, ...]
    tensor: torch.Tensor
    registered: bool  # a parameter or a buffer


def _addresses(model: torch.nn.Module) -> dict[str, _Held]:
    out = {}
    for named in named_tensors(model):
        t = named.tensor
        if t.numel() == 0 or not _has_bytes(t):
            continue
        out[named.name] = _Held(t.data_ptr(), _layout(t), t, named.registered)
    return out


def _names_by_storage(addresses: dict[str, _Held]) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, held in addresses.items():
        names.setdefault(_storage_ptr(held.tensor), name)
    return names


_ReadKey = tuple[int, int, int, int, int | None, int]


def _external_reads(traces: Sequence[Trace]) -> dict[_ReadKey, TensorRead]:
    out: dict[_ReadKey, TensorRead] = {}
    for call, t in enumerate(traces):
        for r in t.external_reads():
            if r.subclass or not r.storage_data_ptr:
                continue
            out[(call, r.op_index, r.depth, r.arg, r.element, r.object)] = r
    return out


def _same_read(a: TensorRead, b: TensorRead) -> bool:
    return (a.data_ptr, a.sizes, a.strides, a.dtype) == (b.data_ptr, b.sizes, b.strides, b.dtype)


def _op_names(traces: Sequence[Trace]) -> list[list[str]]:
    return [[op.name for op in t.ops] for t in traces]


def _ops_difference(captured: list[list[str]], now: list[list[str]]) -> str | None:
    if len(captured) != len(now):
        return (f"the step calls the model {len(now)} times, the captured step {len(captured)} times: "
                "a graph replays the calls it captured")
    for call, (a, b) in enumerate(zip(captured, now, strict=True)):
        for index in range(max(len(a), len(b))):
            x = a[index] if index < len(a) else "(end)"
            y = b[index] if index < len(b) else "(end)"
            if x != y:
                return (f"model call {call}: the ops differ from the captured ones from op #{index} on "
                        f"(captured {x}, now {y}): a graph replays the ops it captured")
    return None


def _is_exempt(name: str | None, patterns: Sequence[str]) -> bool:
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _live_tensor_bytes(leave_out: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of every tensor Python's collector
    tracks, those of ``leave_out`` aside."""
    gc.collect()
    skip = {_storage_ptr(t) for t in leave_out}
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor) or not _has_bytes(obj):
            continue
        ptr = _storage_ptr(obj)
        if not ptr or ptr in seen or ptr in skip:
            continue
        seen.add(ptr)
        total += obj.untyped_storage().nbytes()
    return total


_DIFFERS = ": output differs from a fresh engine's with the same weights by up to "


def _value_difference(now: _Step, fresh: _Step, before: _Step) -> tuple[str | None, float]:
    """The first module whose output is not the fresh engine's (with why),
    and the largest log-probability difference."""
    lp = max((abs(a - b) for a, b in zip(now.logprobs, fresh.logprobs, strict=False)), default=0.0)
    if len(now.logprobs) != len(fresh.logprobs):
        lp = float("inf")
    if [n for n, _ in now.outputs] != [n for n, _ in fresh.outputs]:
        return ("the modules the step ran differ from a fresh engine's "
                f"({len(now.outputs)} outputs, the fresh engine's {len(fresh.outputs)})"), lp
    previous = dict(before.outputs)
    for index, ((name, a), (_, b)) in enumerate(zip(now.outputs, fresh.outputs, strict=True)):
        if a.shape == b.shape and _close(a, b):
            continue
        if a.shape != b.shape:
            return (f"{name}: output of shape {list(a.shape)}, a fresh engine's {list(b.shape)} "
                    f"(module call {index})"), lp
        diff = float((a - b).abs().max())
        old = previous.get(name)
        if old is not None and old.shape == a.shape and _close(a, old) and not _close(old, b):
            return (f"{name}: kept its output from before the sync (module call {index}; a fresh engine "
                    f"with the checkpoint differs by up to {diff:.3g}): the sync did not load its weights"), lp
        return (f"{name}{_DIFFERS}{diff:.3g} "
                f"(module call {index}, the first that differs)"), lp
    if now.tokens != fresh.tokens:
        return f"generated tokens {now.tokens}, a fresh engine's {fresh.tokens}", lp
    return None, lp


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not torch.isfinite(a).all() or not torch.isfinite(b).all():
        return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
    scale = max(1.0, float(b.abs().max()) if b.numel() else 1.0)
    return bool((a - b).abs().max() <= 1e-3 * scale) if a.numel() else True


def check_engine(
    llm: Any,
    sync: Sync,
    *,
    reloads: int = 2,
    seed: int | None = None,
    prompt: Sequence[int] = DEFAULT_PROMPT,
    exempt: Iterable[str] = (),
    engine_args: dict[str, Any] | None = None,
    name: str | None = None,
    fresh_timeout: float = 900.0,
    workdir: str | None = None,
) -> EngineReport:
    """Checks that ``sync(llm, checkpoint)`` pushes new weights into a
    running vLLM engine the way a captured CUDA graph and a fresh engine
    would accept (the module docstring has the steps).

    ``llm`` is a ``vllm.LLM`` whose engine runs in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank), built on a local model
    folder with safetensors files. ``sync`` is the code under test; the
    checkpoints it gets are ``EngineCheckpoint``s drawn from that folder
    (seeds ``seed``, ``seed + 1``, ...), one per reload; by default the
    first seed no earlier check of this engine used, so each check's
    checkpoints differ from the weights the engine holds. ``exempt``: glob
    patterns of tensor names left out of the address checks (on the CPU
    platform ``CPU_PLATFORM_REBUILDS`` are added). ``engine_args``: the
    ``LLM`` arguments of the fresh engines (default ``engine_args_of(llm)``).
    The checkpoints are written under ``workdir`` (default: a temporary
    folder, removed at the end).

    Each phase is logged as it starts (INFO, logger
    ``reloadsafe.vllm_engine``; pytest shows it with ``--log-cli-level=INFO``).

    Returns an ``EngineReport``; raises ``ReloadCheckError`` when the engine
    cannot be checked (not in this process, no local safetensors, a fresh
    engine that cannot be built, a forward that is not the same op sequence
    twice without a sync).
    """
    if reloads < 1:
        raise ReloadCheckError(f"check_engine: reloads must be at least 1, got {reloads}")
    runner = model_runner_of(llm)
    folder = _model_folder(llm)
    model: torch.nn.Module = runner.model
    patterns = list(exempt)
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            patterns += CPU_PLATFORM_REBUILDS
    except ImportError:
        pass
    args = dict(engine_args) if engine_args is not None else engine_args_of(llm)
    label = name if name else str(getattr(sync, "__name__", "sync"))
    if seed is None:
        # A check after another on the same engine draws other checkpoints:
        # weights the engine already holds would hide a sync that loads nothing.
        seed = int(getattr(llm, "_reloadsafe_next_seed", 1))
    llm._reloadsafe_next_seed = max(seed + reloads, int(getattr(llm, "_reloadsafe_next_seed", 1)))
    owned = workdir is None
    work = tempfile.mkdtemp(prefix="reloadsafe-engine-") if owned else workdir
    assert work is not None
    model_config = llm.llm_engine.vllm_config.model_config
    where = (model_config.model, getattr(model_config, "model_weights", None), model_config.revision)
    try:
        try:
            _run_step(llm, model, prompt, traced=False)  # warm-up
        except Exception as e:
            left = _meta_tensors(model)
            why = (f"{left} of its parameters and buffers are on the meta device: a reload it did not finish, "
                   "such as one whose sync raised, left it so; build a new LLM to check it again. "
                   if left else "")
            raise ReloadCheckError(
                f"check_engine: the engine's warm-up step, before any sync of this check, raised. {why}"
                f"The error: {type(e).__name__}: {e}") from e
        _log.info("check_engine %s: drawing %d checkpoints from %s", label, reloads, folder)
        checkpoints = [_draw_checkpoint(folder, seed + k, os.path.join(work, f"checkpoint-{seed + k}"))
                       for k in range(reloads)]
        _log.info("check_engine %s: %d fresh engines, one per checkpoint (a subprocess)", label, reloads)
        fresh = _fresh_steps(args, checkpoints, prompt, work, fresh_timeout)
        _log.info("check_engine %s: the captured and the control step, traced", label)

        captured = _run_step(llm, model, prompt, traced=True)
        control = _run_step(llm, model, prompt, traced=True)
        captured_ops = _op_names(captured.traces)
        differs = _ops_difference(captured_ops, _op_names(control.traces))
        if differs is not None:
            raise ReloadCheckError(
                f"check_engine: two steps without a sync ran different ops ({differs}); the check "
                "compares a step after each sync with the captured one and needs the same ops each time")
        addresses = _addresses(model)
        storage_names = _names_by_storage(addresses)
        captured_reads = _external_reads(captured.traces)
        control_reads = _external_reads(control.traces)
        # Held: made before the step (not by the runner around the forward)
        # and read at the same address by the control step.
        held = {k: r for k, r in captured_reads.items()
                if r.allocation_epoch <= captured.start_epoch
                and k in control_reads and _same_read(r, control_reads[k])}
        held_names = {k: storage_names.get(r.storage_data_ptr) for k, r in held.items()}
        exempt_names = sorted(n for n in addresses if _is_exempt(n, patterns))
        captured.traces.clear()
        control.traces.clear()

        results: list[EngineReload] = []
        before = control
        digests_before = _digests(model)
        for k, (checkpoint, reference) in enumerate(zip(checkpoints, fresh, strict=True), start=1):
            found: list[str] = []
            _log.info("check_engine %s: reload %d of %d (seed %d): the sync, then a traced step", label, k,
                      reloads, checkpoint.seed)
            try:
                sync(llm, checkpoint)
            except Exception as e:  # the sync under test raised: that is its verdict
                left = _meta_tensors(model)
                found.append(f"the sync raised {type(e).__name__}: {e}" + (
                    f" (it left {left} of the model's parameters and buffers on the meta device, a reload "
                    "not finished: the engine cannot run until it is built again)" if left else ""))
                results.append(EngineReload(k, checkpoint.seed, tuple(found), float("inf"), 0))
                break
            now = _run_step(llm, model, prompt, traced=True)
            addresses_now = _addresses(model)
            moved, unread = _address_findings(addresses_now, addresses, patterns)
            found += [finding for _, finding in moved]
            differs = _ops_difference(captured_ops, _op_names(now.traces))
            if differs is not None:
                found.append(differs)
            else:
                found += _read_findings(held, held_names, _external_reads(now.traces),
                                        _names_by_storage(addresses_now), patterns,
                                        already={name for name, _ in moved})
            now.traces.clear()
            digests_now = _digests(model)
            differ = [n for n, d in digests_now.items() if n in reference.digests and d != reference.digests[n]]
            found += _bytes_findings(differ, digests_now, digests_before, reference.digests)
            value, lp = _value_difference(now, reference, before)
            if value is not None and _DIFFERS in value:
                if differ:
                    value += "; the tensors named above hold other bytes than a fresh engine's"
                else:
                    value += ("; every parameter and buffer holds a fresh engine's bytes, so the state "
                              "its kernel reads beyond them (a packed copy, a handle) was made from other "
                              "values: post-processing ran before all of its tensors arrived, or did not "
                              "run again")
            if value is not None:
                found.append(value)
            live = _live_tensor_bytes(checkpoint.tensors.values())
            results.append(EngineReload(k, checkpoint.seed, tuple(found), lp, live, tuple(unread)))
            before, digests_before = now, digests_now
        overall = _memory_findings(results, checkpoints)
        return EngineReport(label, folder, tuple(results), len(held), len(captured_reads) - len(held),
                            tuple(exempt_names), tuple(overall))
    finally:
        # reload_weights(weights_path=...) points the engine's configuration
        # at the folder it read: back to the model's own folder, not to a
        # checkpoint of the check (removed now).
        if os.path.abspath(str(model_config.model)).startswith(os.path.abspath(work) + os.sep):
            model_config.model, model_weights, model_config.revision = where
            if model_weights is not None:
                model_config.model_weights = model_weights
        if owned:
            shutil.rmtree(work, ignore_errors=True)


def _address_findings(now: dict[str, _Held], captured: dict[str, _Held],
                      patterns: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(violations as (name, text), moved_unread): a parameter or buffer not
    where it was captured is a violation; another tensor (an attribute, a
    closure's) that moved is listed (a read of it is a violation of
    _read_findings)."""
    found: list[tuple[str, str]] = []
    unread: list[str] = []
    for name, held in captured.items():
        if _is_exempt(name, patterns):
            continue
        after = now.get(name)
        if after is not None and (after.data_ptr, after.layout) == (held.data_ptr, held.layout):
            continue
        if not held.registered:
            unread.append(name)
        elif after is None:
            found.append((name, f"{name}: gone from the model after the sync (captured at {held.data_ptr:#x}); a "
                         "graph still reads its old memory"))
        elif after.data_ptr != held.data_ptr:
            found.append((name, f"{name}: moved from {held.data_ptr:#x} to {after.data_ptr:#x} by the sync; a graph "
                         "reads the old memory (write into the tensor the engine has: param.data.copy_(new))"))
        else:
            found.append((name, f"{name}: its layout changed from {_describe(held.layout)} to "
                         f"{_describe(after.layout)} at the same address; a graph's kernels keep the "
                         "captured layout"))
    return found, unread


def _describe(layout: tuple[Any, ...]) -> str:
    sizes, strides, dtype, offset = layout
    return f"{str(dtype).removeprefix('torch.')}{list(sizes)} stride {list(strides)} offset {offset}"


# Note [Reads compared are a replay]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A CUDA graph replays the ops it captured with the addresses it captured. The
# check cannot replay a CPU engine's step, but it can run the step again after
# the sync and compare it with the capture op by op: the same op sequence (a
# graph has no other), and for each held read (an argument, by model call, op
# index, nesting depth, argument and element) the same address, sizes, strides
# and dtype. A held read the step now makes elsewhere is one a replay would make
# at the old address, reading memory the sync no longer writes: a violation,
# named by the tensor the model reached at the captured address (a parameter, a
# buffer, an attribute, a closure's tensor), or "an undeclared tensor" where no
# module reaches it (a kernel object's workspace, a cache). A read compared this
# way needs the step to be deterministic in its ops: two steps without a sync
# that differ make the check refuse the engine rather than guess.


def _read_findings(held: dict[_ReadKey, TensorRead], held_names: dict[_ReadKey, str | None],
                   now: dict[_ReadKey, TensorRead], names_now: dict[int, str],
                   patterns: Sequence[str], already: Iterable[str] = ()) -> list[str]:
    """A held read of the capture that the step after the sync does not
    make at the same address, once per tensor (those in ``already``, found
    moved by _address_findings, not again)."""
    found = []
    reported: set[str] = set(already)
    for key, read in held.items():
        name = held_names[key]
        if _is_exempt(name, patterns):
            continue
        after = now.get(key)
        if after is not None and _same_read(read, after):
            continue
        label = name or "an undeclared tensor (reachable from no module attribute)"
        if label in reported:
            continue
        reported.add(label)
        where = f"model call {key[0]}, op #{read.op_index} {read.op} arg {read.arg} ({read.arg_name})"
        if after is None:
            found.append(f"{label}: the captured read ({where}) is no read after the sync")
            continue
        now_name = names_now.get(after.storage_data_ptr) or "memory reachable from no module attribute"
        found.append(f"{label}: read at {read.data_ptr:#x} by the captured step ({where}); after the sync the "
                     f"forward reads {now_name} at {after.data_ptr:#x}: a graph replay would read the old memory")
    return found


def _bytes_findings(differ: Sequence[str], now: dict[str, str], before: dict[str, str],
                    fresh: dict[str, str], limit: int = 8) -> list[str]:
    """For each parameter or buffer in ``differ`` (its bytes after the sync
    are not a fresh engine's with the same checkpoint: what a graph replays,
    whether or not the check's prompt reaches it, an expert no token is
    routed to), why, from the digests now, before the sync and fresh."""
    found = []
    for name in differ[:limit]:
        kind, _, digest = now[name].partition(":")
        fresh_kind, _, fresh_digest = fresh[name].partition(":")
        if before.get(name) == now[name]:
            why = "it kept its bytes from before the sync: the sync did not load it"
        elif kind != fresh_kind:
            why = f"it is {kind}, a fresh engine's {fresh_kind}"
        else:
            why = _slices_differ(digest, fresh_digest) or (
                "the sync loaded it, but not as a first load does (another tensor's values, or "
                "post-processing that a reload skips or repeats)")
        found.append(f"{name}: its bytes after the sync are not a fresh engine's with the same "
                     f"checkpoint; {why}")
    if len(differ) > limit:
        found.append(f"... and {len(differ) - limit} more tensors whose bytes are not a fresh engine's")
    return found


def _slices_differ(digest: str, fresh_digest: str) -> str | None:
    """Which slices along the first dimension differ (digests of
    ``_digests``), and where one holds what the fresh engine has at another
    index: an expert loaded into another expert's place."""
    now_slices = digest.partition("|")[2].split(",") if "|" in digest else []
    fresh_slices = fresh_digest.partition("|")[2].split(",") if "|" in fresh_digest else []
    if not now_slices or len(now_slices) != len(fresh_slices):
        return None
    differ = [i for i, (a, b) in enumerate(zip(now_slices, fresh_slices, strict=True)) if a != b]
    where = {i: fresh_slices.index(now_slices[i]) for i in differ if now_slices[i] in fresh_slices}
    text = (f"{len(differ)} of its {len(now_slices)} slices along the first dimension (experts) "
            f"differ: {', '.join(map(str, differ[:8]))}{' ...' if len(differ) > 8 else ''}")
    if where:
        pairs = ", ".join(f"{i} holds {j}'s" for i, j in list(where.items())[:8])
        text += (f"; {pairs} (what a fresh engine holds at that index): the sync put an expert's weights "
                 "in another expert's place (an expert map it did not update)")
    return text


def _memory_findings(results: Sequence[EngineReload], checkpoints: Sequence[EngineCheckpoint]) -> list[str]:
    held = [r.tensor_bytes for r in results if r.tensor_bytes]
    if len(held) < 2 or not checkpoints:
        return []
    per_reload = min(c.nbytes for c in checkpoints)
    steps = [b - a for a, b in zip(held, held[1:], strict=False)]
    if all(s >= per_reload // 2 for s in steps):
        mib = ", ".join(f"{b / 2**20:.1f}" for b in held)
        return [f"memory: the tensors held grow with every reload ({mib} MiB after each; a checkpoint is "
                f"{per_reload / 2**20:.1f} MiB): the sync keeps what it loaded alive"]
    return []


if __name__ == "__main__":
    _fresh_main(sys.argv[1])
