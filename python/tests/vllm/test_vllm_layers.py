"""check_reload over vLLM 0.33's own layers, built on a CPU.

Every layer here is vLLM's: built inside its configuration context, loaded
through its parameters' weight loaders (unfused q/k/v and gate/up checkpoint
tensors go to the fused parameter with their shard ids), post-processed by
vLLM's model loader, and reloaded either through the loaders again or
through vLLM's own layerwise reload (reloadsafe.vllm). A correct layer
passes; where vLLM itself breaks a reload, a test named ``test_vllm_bug_*``
pins the finding, with the layer and the mechanism in its docstring.

The module runs in vLLM 0.33's environment (tools/vllm_check.sh makes that
environment and runs this folder); anywhere else it is skipped with the
reason. What cannot run on a CPU with vLLM's CUDA wheel (no CPU kernels in
vllm._C: bf16 unquantized linears on AMX CPUs, W8A8 int8, GPTQ/AWQ, offline
per-tensor FP8, FusedMoE) is not built here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

# This folder is named vllm: were vLLM missing, `import vllm` could import
# the folder itself as a namespace package (python/tests is on sys.path), so
# the installed distribution is asked first.
try:
    VLLM_VERSION: str | None = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    VLLM_VERSION = None
if VLLM_VERSION is None:
    _SKIP = ("vLLM is not installed in this environment; tools/vllm_check.sh runs these tests in vLLM 0.33's "
             "own environment")
elif not VLLM_VERSION.startswith("0.33."):
    _SKIP = (f"written against vLLM 0.33's layers, loaders and reload module; this environment has vLLM "
             f"{VLLM_VERSION}")
else:
    _SKIP = ""
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)
# vLLM's CPU platform: without a GPU, vLLM's CUDA wheel cannot infer a device.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vLLM 0.33 is installed but does not import here")

import torch  # noqa: E402
from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.model_executor.layers import layernorm, linear, vocab_parallel_embedding  # noqa: E402
from vllm.model_executor.layers.logits_processor import LogitsProcessor  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.llama3_rope import Llama3RotaryEmbedding  # noqa: E402

from reloadsafe import check_reload  # noqa: E402
from reloadsafe import vllm as rv  # noqa: E402

RELOADS = 3
HIDDEN = 64
HEAD, Q_HEADS, KV_HEADS = 16, 4, 2
VOCAB = 200  # vLLM pads it to 256 rows
INTERMEDIATE = 48

# The smallest model folder vLLM's ModelConfig accepts offline: a config.json.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * INTERMEDIATE,
    "num_attention_heads": Q_HEADS,
    "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": 1,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmConfig]:
    """vLLM's configuration for a CPU (every custom op on its plain-torch
    forward) and a one-process distributed world, with vLLM's MXFP8
    emulation kernel registered for the CPU platform meanwhile."""
    folder = tmp_path_factory.mktemp("vllm-model")
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIG))
    cfg = VllmConfig(
        model_config=ModelConfig(model=str(folder), skip_tokenizer_init=True, dtype="bfloat16"),
        compilation_config=CompilationConfig(custom_ops=["none"]),
        device_config=DeviceConfig(device="cpu"),
    )
    with rv.one_process_world(cfg), _mxfp8_emulation_on_cpu():
        yield cfg


@contextlib.contextmanager
def _mxfp8_emulation_on_cpu() -> Iterator[None]:
    """vLLM lists no MXFP8 linear kernel for its CPU platform; its emulation
    kernel (dequantize to bf16 once, at load) runs on a CPU once registered."""
    from vllm.model_executor.kernels import linear as kernels
    from vllm.model_executor.kernels.linear.mxfp8.emulation import EmulationMxfp8LinearKernel
    from vllm.platforms import PlatformEnum

    kernels.register_linear_kernel(EmulationMxfp8LinearKernel, PlatformEnum.CPU, "mxfp8")
    try:
        yield
    finally:
        # register_linear_kernel has no counterpart; the list is vLLM's.
        kernels._POSSIBLE_MXFP8_KERNELS[PlatformEnum.CPU].remove(EmulationMxfp8LinearKernel)


# --- checkpoints and inputs ---------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _fp8_channel(seed: int, out: int, inp: int) -> dict[str, torch.Tensor]:
    """A compressed-tensors FP8 checkpoint: float8_e4m3fn weight, one
    float32 scale per output channel."""
    return {
        "weight": _randn(seed, out, inp).to(torch.float8_e4m3fn),
        "weight_scale": torch.rand(out, 1, generator=_gen(seed + 1)) * 0.01 + 0.001,
    }


def _mxfp8(seed: int, out: int, inp: int) -> dict[str, torch.Tensor]:
    """A compressed-tensors MXFP8 checkpoint: float8_e4m3fn weight, one E8M0
    exponent (uint8, 127 = 1.0) per 32 inputs."""
    return {
        "weight": _randn(seed, out, inp).to(torch.float8_e4m3fn),
        "weight_scale": torch.randint(120, 130, (out, inp // 32), generator=_gen(seed + 1)).to(torch.uint8),
    }


def _w4a8(seed: int, out: int, inp: int) -> dict[str, torch.Tensor]:
    """A compressed-tensors W4A8 checkpoint: int4 values in int8, one scale
    per output channel."""
    return {
        "weight_packed": torch.randint(-8, 8, (out, inp), generator=_gen(seed), dtype=torch.int8),
        "weight_scale": torch.rand(out, 1, generator=_gen(seed + 1)) * 0.01 + 0.001,
    }


def _x(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _randn(99, 8, HIDDEN, dtype=dtype)


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (8,), generator=_gen(98))


# --- quantization configs -------------------------------------------------------


def _compressed_tensors(weights: dict[str, Any], activations: dict[str, Any]) -> Any:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    return CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors",
        "format": "float-quantized" if weights["type"] == "float" else "int-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations}},
        "ignore": [],
    })


def ct_w8a8_fp8() -> Any:
    """FP8 weights with a per-channel scale, activations FP8 per token,
    dynamic (llm-compressor's FP8_DYNAMIC)."""
    return _compressed_tensors(
        {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True},
    )


def ct_mxfp8() -> Any:
    group = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True,
             "scale_dtype": "torch.uint8"}
    return _compressed_tensors({**group, "dynamic": False}, {**group, "dynamic": True})


def ct_w4a8_int() -> Any:
    return _compressed_tensors(
        {"num_bits": 4, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
        {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True},
    )


def online(weight_key: str) -> Any:
    """vLLM's online quantization (a bf16 checkpoint quantized while it
    loads) of every linear layer, for a QuantKey of quant_utils."""
    from vllm.config.quantization import QuantizationConfigArgs, QuantSpec
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.model_executor.layers.quantization.utils import quant_utils

    return OnlineQuantizationConfig(QuantizationConfigArgs(linear=QuantSpec(weight=getattr(quant_utils, weight_key))))


# --- a block that reads a rotary embedding ---------------------------------------


class AttentionInput(torch.nn.Module):
    """q and k rotated and v, as vLLM's Llama attention computes them before
    the attention kernel: QKVParallelLinear, then the rotary embedding (whose
    cos/sin cache is a non-persistent buffer no checkpoint holds, which
    vLLM's layerwise reload puts on the meta device and back)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = linear.QKVParallelLinear(HIDDEN, HEAD, Q_HEADS, KV_HEADS, bias=False,
                                                 params_dtype=torch.float32)
        self.rotary_emb = RotaryEmbedding(HEAD, HEAD, 256, 10000.0, True, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(x)
        q, k, v = qkv.split([Q_HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        positions = torch.arange(x.shape[0], device=x.device) * 7  # spread over the cache
        q, k = self.rotary_emb(positions, q, k)
        return torch.cat([q, k, v], dim=-1)


def _rotate(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A rotary embedding alone: q and k are the input's columns."""
    positions = torch.arange(x.shape[0], device=x.device) * 7
    q, k = layer(positions, x[:, : Q_HEADS * HEAD], x[:, Q_HEADS * HEAD:])
    return torch.cat([q, k], dim=-1)


def _qk() -> torch.Tensor:
    return _randn(97, 8, (Q_HEADS + KV_HEADS) * HEAD)


def _nothing(seed: int) -> dict[str, torch.Tensor]:
    """A rotary embedding has nothing in a checkpoint: a reload must leave
    its cache where the captured forward reads it."""
    return {}


# --- the layers --------------------------------------------------------------


def _first(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vLLM's linear layers return (output, output bias)."""
    return layer(x)[0]


def _call(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def _with_residual(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    # The fused add writes into x and the residual: the check's input is cloned.
    out, residual = layer(x.clone(), x * 0.5)
    return torch.cat([out, residual], dim=-1)


def _gated(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x, x.flip(-1))


class Logits(torch.nn.Module):
    """The logits of a causal LM as vLLM's models compute them: the
    LogitsProcessor over the ParallelLMHead (the head's weight times the
    hidden states, the padded vocabulary rows cut off)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = vocab_parallel_embedding.ParallelLMHead(VOCAB, HIDDEN, params_dtype=torch.float32)
        self.logits_processor = LogitsProcessor(VOCAB)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden)


QKV_SHARDS = {
    "q_proj.weight": ("weight", "q"), "k_proj.weight": ("weight", "k"), "v_proj.weight": ("weight", "v"),
    "q_proj.bias": ("bias", "q"), "k_proj.bias": ("bias", "k"), "v_proj.bias": ("bias", "v"),
}
GATE_UP_SHARDS = {"gate_proj.weight": ("weight", 0), "up_proj.weight": ("weight", 1)}

BOTH = rv.RELOAD_WAYS
# vLLM's online quantization reloads through its layerwise reload only: its
# loader quantizes while it loads, into a parameter that is no longer in the
# checkpoint's form after the first load (FP8 and transposed: a second load
# through the loader raises), and its post-processing runs once per layer
# unless a layerwise reload resets it.
LAYERWISE = ("layerwise",)


# Warnings the check rightly gives some correct layers:
# - vLLM compiles its FP8 activation quantization (QuantFP8.forward_native
#   under torch.compile); Inductor's CPU kernels allocate their outputs
#   outside PyTorch's dispatcher, so the trace cannot replay the _scaled_mm
#   that reads the quantized activation, and says so (the live forward is
#   still compared with a cold load).
COMPILED_ACTIVATION_QUANT = "not replayed: aten::_scaled_mm reads a tensor the forward made without an op"
# - vLLM keeps every online-quantized layer whose metadata was recorded for
#   reloading alive (test_vllm_bug_layerwise_metadata_keeps_online_quantized_layers_alive):
#   the check's cold loads stay alive, which it reports apart from the reloads.
LAYERS_KEPT_ALIVE = "layers built aside (the check's cold loads) keep"



@dataclasses.dataclass(frozen=True)
class Case:
    """A vLLM layer as check_reload takes it."""

    name: str
    build: Callable[[], torch.nn.Module]
    checkpoint: Callable[[int], dict[str, torch.Tensor]]
    example: Callable[[], torch.Tensor] = _x
    forward: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = _first
    shards: Mapping[str, tuple[str, rv.ShardId]] = dataclasses.field(default_factory=dict)
    ways: tuple[str, ...] = BOTH
    # Warnings the check gives a correct layer, each a substring of its
    # message (every other warning fails the test).
    warnings: tuple[str, ...] = ()


def _linear_checkpoint(out: int, bias: bool) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(seed: int) -> dict[str, torch.Tensor]:
        ckpt = {"weight": _randn(seed, out, HIDDEN)}
        if bias:
            ckpt["bias"] = _randn(seed + 1, out)
        return ckpt

    return make


def _qkv_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    sizes = {"q_proj": Q_HEADS * HEAD, "k_proj": KV_HEADS * HEAD, "v_proj": KV_HEADS * HEAD}
    ckpt = {}
    for i, (name, rows) in enumerate(sizes.items()):
        ckpt[f"{name}.weight"] = _randn(seed + 10 * i, rows, HIDDEN)
        ckpt[f"{name}.bias"] = _randn(seed + 10 * i + 1, rows)
    return ckpt


def _gate_up_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    return {"gate_proj.weight": _randn(seed, INTERMEDIATE, HIDDEN),
            "up_proj.weight": _randn(seed + 1, INTERMEDIATE, HIDDEN)}


def _attention_input_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    return {f"qkv_proj.{k}": v for k, v in _qkv_checkpoint(seed).items() if k.endswith(".weight")}


def _norm_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    return {"weight": _randn(seed, HIDDEN)}


def _vocab_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    return {"weight": _randn(seed, VOCAB, HIDDEN)}  # 200 rows into a [256, 64] parameter


def _bf16(seed: int) -> dict[str, torch.Tensor]:
    return {"weight": _randn(seed, 32, HIDDEN, dtype=torch.bfloat16)}


def _bf16_x() -> torch.Tensor:
    return _x(torch.bfloat16)


CASES = [
    Case("ColumnParallelLinear", lambda: linear.ColumnParallelLinear(HIDDEN, 32, bias=True, params_dtype=torch.float32),
         _linear_checkpoint(32, bias=True)),
    Case("RowParallelLinear", lambda: linear.RowParallelLinear(HIDDEN, 32, bias=True, params_dtype=torch.float32),
         _linear_checkpoint(32, bias=True)),
    Case("ReplicatedLinear", lambda: linear.ReplicatedLinear(HIDDEN, 32, bias=False, params_dtype=torch.float32),
         _linear_checkpoint(32, bias=False)),
    Case("QKVParallelLinear", lambda: linear.QKVParallelLinear(HIDDEN, HEAD, Q_HEADS, KV_HEADS, bias=True,
                                                                params_dtype=torch.float32),
         _qkv_checkpoint, shards=QKV_SHARDS),
    Case("MergedColumnParallelLinear",
         lambda: linear.MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE, INTERMEDIATE], bias=False,
                                                   params_dtype=torch.float32),
         _gate_up_checkpoint, shards=GATE_UP_SHARDS),
    Case("VocabParallelEmbedding", lambda: vocab_parallel_embedding.VocabParallelEmbedding(
        VOCAB, HIDDEN, params_dtype=torch.float32), _vocab_checkpoint, example=_ids, forward=_call),
    Case("ParallelLMHead+LogitsProcessor", Logits, lambda s: {"lm_head.weight": _vocab_checkpoint(s)["weight"]},
         forward=_call),
    Case("RMSNorm", lambda: layernorm.RMSNorm(HIDDEN, dtype=torch.float32), _norm_checkpoint, forward=_call),
    Case("RMSNorm-residual", lambda: layernorm.RMSNorm(HIDDEN, dtype=torch.float32), _norm_checkpoint,
         forward=_with_residual),
    Case("RMSNorm-var_hidden_size", lambda: layernorm.RMSNorm(HIDDEN, var_hidden_size=32, dtype=torch.float32),
         _norm_checkpoint, forward=_call),
    Case("GemmaRMSNorm", lambda: layernorm.GemmaRMSNorm(HIDDEN), _norm_checkpoint, forward=_call),
    Case("RMSNormGated", lambda: layernorm.RMSNormGated(HIDDEN, group_size=16, norm_before_gate=True,
                                                        dtype=torch.float32),
         _norm_checkpoint, forward=_gated),
    Case("RotaryEmbedding", lambda: RotaryEmbedding(HEAD, HEAD, 256, 10000.0, True, torch.float32), _nothing,
         example=_qk, forward=_rotate),
    Case("Llama3RotaryEmbedding", lambda: Llama3RotaryEmbedding(HEAD, HEAD, 256, 500000.0, True, torch.float32,
                                                              8.0, 1.0, 4.0, 64),
         _nothing, example=_qk, forward=_rotate),
    Case("QKV+RotaryEmbedding", AttentionInput, _attention_input_checkpoint, forward=_call,
         shards={f"qkv_proj.{k}": (f"qkv_proj.{p}", s) for k, (p, s) in QKV_SHARDS.items()}),
    Case("online-fp8_per_channel", lambda: linear.ColumnParallelLinear(
        HIDDEN, 32, bias=False, params_dtype=torch.bfloat16, quant_config=online("kFp8StaticChannelSym"),
        prefix="model.layers.0.mlp.proj"), _bf16, example=_bf16_x, ways=LAYERWISE,
         warnings=(COMPILED_ACTIVATION_QUANT, LAYERS_KEPT_ALIVE)),
    Case("online-mxfp8-emulation", lambda: linear.ColumnParallelLinear(
        HIDDEN, 32, bias=False, params_dtype=torch.bfloat16, quant_config=online("kMxfp8Dynamic"),
        prefix="model.layers.0.mlp.proj"), _bf16, example=_bf16_x, ways=LAYERWISE,
         warnings=(LAYERS_KEPT_ALIVE,)),
    Case("compressed-tensors-W8A8-FP8", lambda: linear.ColumnParallelLinear(
        HIDDEN, HIDDEN, bias=False, params_dtype=torch.bfloat16, quant_config=ct_w8a8_fp8(),
        prefix="model.layers.0.mlp.proj"), lambda s: _fp8_channel(s, HIDDEN, HIDDEN), example=_bf16_x,
         ways=LAYERWISE, warnings=(COMPILED_ACTIVATION_QUANT,)),  # the loaders: test_vllm_bug_compressed_tensors_fp8_*
    Case("compressed-tensors-MXFP8-emulation", lambda: linear.ColumnParallelLinear(
        HIDDEN, 32, bias=False, params_dtype=torch.bfloat16, quant_config=ct_mxfp8(),
        prefix="model.layers.0.mlp.proj"), lambda s: _mxfp8(s, 32, HIDDEN), example=_bf16_x),
]

BY_NAME = {case.name: case for case in CASES}
PARAMS = [pytest.param(case, way, id=f"{case.name}-{way}") for case in CASES for way in case.ways]

def _check(config: VllmConfig, case: Case, way: str, **kw: Any) -> Any:
    """check_reload over ``case``, built, loaded and reloaded the vLLM way
    ``way`` names (reloadsafe.vllm.VllmLoading)."""
    loading = rv.VllmLoading(config, case.shards, reload=way)
    return check_reload(
        rv.layer_factory(config, case.build),
        case.example(),
        load=loading.load,
        process=loading.process,
        forward=rv.in_config(config, case.forward),
        make_checkpoint=case.checkpoint,
        reloads=kw.pop("reloads", RELOADS),
        name=f"{case.name} ({way})",
        **kw,
    )


def _warnings(report: Any) -> list[str]:
    return [w["message"] for mode in report.modes.values() for w in mode["warnings"]]


@pytest.mark.parametrize(("case", "way"), PARAMS)
def test_a_correct_vllm_layer_keeps_its_addresses(config: VllmConfig, case: Case, way: str) -> None:
    report = _check(config, case, way)
    assert report.ok, report.table()
    for name, mode in report.modes.items():
        assert mode["violations"] == [] and mode["reloads_done"] == RELOADS, (name, report.table())
        assert mode["declared_reads"] >= 1 and mode["undeclared_reads"] == 0, (name, report.table())
    unexpected = [w for w in _warnings(report) if not any(e in w for e in case.warnings)]
    assert not unexpected, report.table()


@pytest.mark.parametrize(("case", "way"), PARAMS)
def test_a_correct_vllm_layer_reloads_to_the_state_of_a_cold_load(config: VllmConfig, case: Case, way: str) -> None:
    """compare_state and host_numbers: after every reload each tensor and
    host number the layer reaches equals what a cold load of the same
    checkpoint holds, and every number keeps its value from the capture
    (padding rows zeroed again, no stale derived tensor, no changed size a
    graph bakes in). vLLM's quantization config, which every layer shares
    and whose online quantization adds its time to a float, is no layer's
    state: the check leaves what two built layers share out."""
    report = _check(config, case, way, compare_state=True, host_numbers=True)
    assert report.ok and not report.errors, report.table()
    for name, mode in report.modes.items():
        assert mode["violations"] == [], (name, report.table())


@pytest.mark.parametrize("way", rv.RELOAD_WAYS)
def test_a_post_processing_that_rebinds_the_weight_is_flagged_unless_layerwise_reload_copies_it_back(
        config: VllmConfig, monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """A negative control on a real vLLM layer: ColumnParallelLinear whose
    unquantized post-processing is made to give the weight new memory on
    every load. Reloaded through the loaders, the weight's new address is
    flagged at the forward's read. vLLM's layerwise reload post-processes a
    scratch copy of the layer and copies the result into the tensors the
    layer had, so there the same post-processing leaves every address as it
    was, and the check passes."""
    vllm_method = linear.UnquantizedLinearMethod.process_weights_after_loading

    def rebinding(self: Any, layer: torch.nn.Module) -> None:
        vllm_method(self, layer)
        layer.weight.data = layer.weight.data.clone()

    monkeypatch.setattr(linear.UnquantizedLinearMethod, "process_weights_after_loading", rebinding)
    report = _check(config, BY_NAME["ColumnParallelLinear"], way)
    if way == "loaders":
        assert not report.ok and "weight" in report.flagged, report.table()
        reads = [v for mode in report.modes.values() for v in mode["violations"]
                 if v.get("read") == "aten::linear arg 1 (weight)" and v["what"] == "address"]
        assert reads, report.table()
    else:
        assert report.ok and not report.flagged, report.table()


def test_vllm_bug_compressed_tensors_fp8_reloaded_through_its_loaders_flips_the_weight(config: VllmConfig) -> None:
    """vLLM 0.33, compressed-tensors W8A8 FP8 (CompressedTensorsW8A8Fp8,
    channel strategy) reloaded through its weight loaders.

    Post-processing transposes the weight in place: the parameter becomes a
    [in, out] view of its own storage (stride (1, in)). A reload through the
    loader then copies the [out, in] checkpoint into that view, and
    post-processing transposes again, so each reload flips the weight's
    strides: a captured CUDA graph whose GEMM baked in one layout multiplies
    by the transpose after every other reload. The weight keeps its storage,
    so only a layout check catches it. (With in != out the loader raises
    instead: the view is the wrong shape for the checkpoint.) The same layer
    reloaded through vLLM's layerwise reload passes
    (test_a_correct_vllm_layer_keeps_its_addresses).
    """
    case = BY_NAME["compressed-tensors-W8A8-FP8"]
    report = _check(config, case, "loaders")
    assert not report.ok, report.table()
    assert "weight" in report.flagged, report.table()
    layout = [v for mode in report.modes.values() for v in mode["violations"]
              if v["tensor"] == "weight" and "layout" in v["what"]]
    assert layout, report.table()
    # The layout flips back and forth: every odd reload differs from the capture.
    for mode in report.modes.values():
        flipped = {v["reload"] for v in mode["violations"] if v["tensor"] == "weight" and v["what"] == "layout"}
        assert flipped == {r for r in range(1, RELOADS + 1) if r % 2}, report.table()


def test_vllm_bug_layerwise_reload_raises_on_the_w4a8_int_layer(config: VllmConfig) -> None:
    """vLLM 0.33, compressed-tensors W4A8 int (CompressedTensorsW4A8Int with
    its CPU kernel, Dynamic4bitLinearKernel) reloaded through vLLM's
    layerwise reload.

    The scheme registers one parameter under two names, ``weight`` and
    ``weight_packed``; post-processing packs it (a float32 [1056] blob for a
    [32, 64] int4 weight). The layerwise reload records the two names as two
    meta tensors, loads and packs only ``weight_packed``, and then copies the
    unpacked ``weight`` twin ([32, 64]) into the packed kernel tensor:
    ``finalize_layerwise_reload`` raises a size mismatch, so the layer
    cannot be reloaded in place. check_reload reports the violation
    ``reload`` at reload 1, with vLLM's message. (Through its loaders it cannot be reloaded either: the loader
    meets the packed blob where the [32, 64] parameter was.)
    """
    case = Case("compressed-tensors-W4A8-int", lambda: linear.ColumnParallelLinear(
        HIDDEN, 32, bias=False, params_dtype=torch.float32, quant_config=ct_w4a8_int(),
        prefix="model.layers.0.mlp.proj"), lambda s: _w4a8(s, 32, HIDDEN))
    for way, message in (("layerwise", "The size of tensor a (1056) must match the size of tensor b (64)"),
                         ("loaders", "exceeds dimension size (32)")):
        report = _check(config, case, way)
        assert not report.ok and not report.errors, report.table()
        for mode in report.modes.values():
            raised = [v for v in mode["violations"] if v["tensor"] == "reload"]
            assert raised and raised[0]["reload"] == 1, (way, report.table())
            assert message in raised[0]["after"], (way, report.table())


def test_vllm_bug_layerwise_metadata_keeps_online_quantized_layers_alive(config: VllmConfig) -> None:
    """vLLM 0.33, online quantization (here FP8 per channel) with
    ``record_metadata_for_reloading``, as vLLM's ``initialize_model`` calls
    it for every model it builds.

    The online method wraps the weight's loader in a closure over the layer
    (``online_process_loader``) when the layer is built. Recording the
    layer's metadata copies that loader into the entry of ``LAYERWISE_INFO``,
    a WeakKeyDictionary keyed by the layer; ``sanitize_layer_refs`` strips
    bound methods of the layer from the entry but not closures, so the entry
    keeps its own key alive and no online-quantized layer is ever freed. The
    check sees its cold loads stay alive and reports them apart from the
    reloads (a warning, not a failure: a reload itself does not grow).
    """
    report = _check(config, BY_NAME["online-mxfp8-emulation"], "layerwise", reloads=4)
    assert report.ok, report.table()
    assert any(LAYERS_KEPT_ALIVE in w for w in _warnings(report)), report.table()


@pytest.mark.parametrize(("name", "flagged"), [
    ("QKVParallelLinear", None),
    ("compressed-tensors-MXFP8-emulation", None),
    ("compressed-tensors-W8A8-FP8", "weight"),
])
def test_check_reloads_default_post_processing_runs_the_quant_method(config: VllmConfig, name: str,
                                                                     flagged: str | None) -> None:
    """check_reload's own default post-processing (each module's
    ``quant_method.process_weights_after_loading(module)``, outside vLLM's
    configuration context) on vLLM layers reloaded through their loaders
    gives the verdict vLLM's model-loader post-processing gives."""
    case = BY_NAME[name]
    report = check_reload(
        rv.layer_factory(config, case.build, record_for_reload=False),
        case.example(),
        load=lambda layer, ckpt: rv.load_through_weight_loaders(layer, ckpt, case.shards),
        forward=rv.in_config(config, case.forward),
        make_checkpoint=case.checkpoint,
        reloads=RELOADS,
        name=f"{name} (default post-processing)",
    )
    if flagged is None:
        assert report.ok and not report.flagged, report.table()
    else:
        assert not report.ok and flagged in report.flagged, report.table()
