"""vLLM 0.33's parallel layers at tensor parallel 2, checked on every rank.

``reloadsafe.check_ranks`` starts a gloo world of 2 processes; on each rank
``reloadsafe.vllm.rank_world`` builds vLLM's parallel state over it (tensor
parallel size 2) and the rank checks its shard of a layer: built by vLLM,
loaded from the whole checkpoint through the parameters' weight loaders
(which narrow it to the rank's rows or columns; QKV and merged layers by
shard id, the vocabulary embedding by its rank's range of rows), reloaded
through vLLM's layerwise reload or its loaders. One report carries each
rank's verdict; a post-processing that rebinds the weight on rank 1 only is
flagged on rank 1 only.

The forwards compute the rank's part, without the collective an engine
adds after it: a column layer's output shard (no gather), a row layer on its
input shard (no all-reduce), the embedding's rows this rank holds (vLLM's
forward up to its all-reduce). With the all-reduce in the traced forward the
check flags torch.distributed's ReduceOp, a new object on every call, as an
object the reload replaced: a false alarm left open (the trace compares
opaque objects by identity).

Runs in vLLM 0.33's environment (tools/vllm_check.sh), like
test_vllm_layers.py; skipped elsewhere with the reason.
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

try:
    VLLM_VERSION: str | None = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    VLLM_VERSION = None
if VLLM_VERSION is None or not VLLM_VERSION.startswith("0.33."):
    pytest.skip(f"written against vLLM 0.33's parallel layers; this environment has "
                f"{'no vLLM' if VLLM_VERSION is None else 'vLLM ' + VLLM_VERSION} (tools/vllm_check.sh runs "
                "these tests in vLLM 0.33's own environment)", allow_module_level=True)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from reloadsafe import check_ranks, check_reload  # noqa: E402
from reloadsafe import vllm as rv  # noqa: E402

WORLD = 2
RELOADS = 2
TIMEOUT = 300
HIDDEN = 64
HEAD, Q_HEADS, KV_HEADS = 16, 4, 2
INTERMEDIATE = 48
VOCAB = 200  # padded to 256 rows: 128 per rank

QKV_SHARDS = {f"{p}.{t}": (t, p[0]) for p in ("q_proj", "k_proj", "v_proj") for t in ("weight", "bias")}
GATE_UP_SHARDS = {"gate_proj.weight": ("weight", 0), "up_proj.weight": ("weight", 1)}


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _linear(out: int) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda seed: {"weight": _randn(seed, out, HIDDEN), "bias": _randn(seed + 1, out)}


def _qkv(seed: int) -> dict[str, torch.Tensor]:
    rows = {"q_proj": Q_HEADS * HEAD, "k_proj": KV_HEADS * HEAD, "v_proj": KV_HEADS * HEAD}
    out = {}
    for i, (name, n) in enumerate(rows.items()):
        out[f"{name}.weight"] = _randn(seed + 10 * i, n, HIDDEN)
        out[f"{name}.bias"] = _randn(seed + 10 * i + 1, n)
    return out


def _gate_up(seed: int) -> dict[str, torch.Tensor]:
    return {"gate_proj.weight": _randn(seed, INTERMEDIATE, HIDDEN),
            "up_proj.weight": _randn(seed + 1, INTERMEDIATE, HIDDEN)}


def _first(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x)[0]


def _embedding_part(layer: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """VocabParallelEmbedding's forward on this rank up to its all-reduce:
    its rows of the ids' embeddings, zero for ids another rank holds."""
    from vllm.model_executor.layers.vocab_parallel_embedding import get_masked_input_and_mask

    s = layer.shard_indices
    masked, mask = get_masked_input_and_mask(ids, s.org_vocab_start_index, s.org_vocab_end_index,
                                             s.num_org_vocab_padding, s.added_vocab_start_index,
                                             s.added_vocab_end_index)
    out = layer.quant_method.embedding(layer, masked.long())
    return out.masked_fill(mask.unsqueeze(-1), 0)


Case = tuple[Callable[[], torch.nn.Module], Callable[[int], dict[str, torch.Tensor]], torch.Tensor,
             Callable[[torch.nn.Module, torch.Tensor], torch.Tensor], dict[str, Any]]


def _case(name: str) -> Case:
    """(build, checkpoint, example, forward, shards) of layer ``name``,
    made on the rank (where vLLM is imported)."""
    from vllm.model_executor.layers import linear, vocab_parallel_embedding

    x = _randn(7, 3, HIDDEN)
    cases: dict[str, Case] = {
        "ColumnParallelLinear": (
            lambda: linear.ColumnParallelLinear(HIDDEN, 32, bias=True, gather_output=False,
                                                params_dtype=torch.float32),
            _linear(32), x, _first, {}),
        "RowParallelLinear": (
            # Without its all-reduce a row layer has no bias (vLLM refuses one).
            lambda: linear.RowParallelLinear(HIDDEN, 32, bias=False, input_is_parallel=True,
                                             reduce_results=False, params_dtype=torch.float32),
            lambda seed: {"weight": _randn(seed, 32, HIDDEN)}, x[:, : HIDDEN // WORLD].contiguous(), _first, {}),
        "QKVParallelLinear": (
            lambda: linear.QKVParallelLinear(HIDDEN, HEAD, Q_HEADS, KV_HEADS, bias=True,
                                             params_dtype=torch.float32),
            _qkv, x, _first, QKV_SHARDS),
        "MergedColumnParallelLinear": (
            lambda: linear.MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE, INTERMEDIATE], bias=False,
                                                      params_dtype=torch.float32),
            _gate_up, x, _first, GATE_UP_SHARDS),
        "VocabParallelEmbedding": (
            lambda: vocab_parallel_embedding.VocabParallelEmbedding(VOCAB, HIDDEN, params_dtype=torch.float32),
            lambda seed: {"weight": _randn(seed, VOCAB, HIDDEN)},
            torch.tensor([0, 5, 99, 127, 128, 150, 199]), _embedding_part, {}),
    }
    return cases[name]


def _config() -> Any:
    from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, VllmConfig

    folder = tempfile.mkdtemp(prefix="reloadsafe-tp-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
                   "intermediate_size": 2 * INTERMEDIATE, "num_attention_heads": Q_HEADS,
                   "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "vocab_size": VOCAB,
                   "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}, f)
    return VllmConfig(model_config=ModelConfig(model=folder, skip_tokenizer_init=True, dtype="bfloat16"),
                      compilation_config=CompilationConfig(custom_ops=["none"]),
                      device_config=DeviceConfig(device="cpu"))


def check_layer(rank: int, world_size: int, *, name: str, way: str = "layerwise",
                rebind_on_rank: int | None = None) -> Any:
    """One rank's check of layer ``name``; on rank ``rebind_on_rank`` the
    post-processing also rebinds the weight to a new tensor (planted)."""
    config = _config()
    build, checkpoint, example, forward, shards = _case(name)
    with rv.rank_world(config):
        loading = rv.VllmLoading(config, shards, reload=way)
        process = loading.process
        if rank == rebind_on_rank:
            def process(layer: torch.nn.Module) -> None:
                loading.process(layer)
                layer.weight.data = layer.weight.data.clone()

        return check_reload(rv.layer_factory(config, build), example, load=loading.load, process=process,
                            forward=rv.in_config(config, forward), make_checkpoint=checkpoint,
                            reloads=RELOADS, name=f"{name} rank {rank} of {world_size} ({way})")


@pytest.mark.parametrize("name", ["ColumnParallelLinear", "RowParallelLinear", "QKVParallelLinear",
                                  "MergedColumnParallelLinear", "VocabParallelEmbedding"])
def test_parallel_layer_passes_on_every_rank(name: str) -> None:
    report = check_ranks(functools.partial(check_layer, name=name), WORLD, timeout=TIMEOUT)
    assert report.ok, report.table()
    assert [r.rank for r in report.ranks] == list(range(WORLD))


def test_parallel_layer_reloaded_through_its_loaders_passes_on_every_rank() -> None:
    report = check_ranks(functools.partial(check_layer, name="QKVParallelLinear", way="loaders"), WORLD,
                         timeout=TIMEOUT)
    assert report.ok, report.table()


def test_rebinding_on_one_rank_is_flagged_on_that_rank_only() -> None:
    report = check_ranks(functools.partial(check_layer, name="ColumnParallelLinear", way="loaders",
                                           rebind_on_rank=1), WORLD, timeout=TIMEOUT)
    assert not report.ok
    assert report.ranks[0].ok, report.table()
    assert list(report.flagged) == [1], report.table()
    assert any("weight" in f for f in report.flagged[1]), report.table()
