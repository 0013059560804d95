"""Whole Hugging Face transformers models, built tiny from their configs (no
hub, no download), reloaded the way an RL trainer's weight sync reloads
them, for python/tests/real/test_real_models.py and bench/check_bench.py.

A ``ModelCase`` is one ``check_reload`` call: an architecture (Llama with
tied embeddings, Qwen3, Qwen2-MoE, Mixtral, JetMoE with 8 and with 4 experts,
GPT-2, Recurrent Gemma, Mamba, Gemma 3, DeepSeek-V3, Gemma 3n's text model),
how the model is built (eager in float32 or bfloat16, ``model.compile()``
with a backend, torchao int8 weight-only, or
bitsandbytes 4-bit / 8-bit linears), how a checkpoint is loaded and
post-processed, and what must be flagged (None for a correct reload):

- ``load_state_dict``: every tensor copied into the parameter it names, as
  ``model.load_state_dict(ckpt, strict=False)`` does (correct);
- ``assign``: ``load_state_dict(..., assign=True)``, which binds the
  checkpoint's tensors as the parameters: every address moves (a bug);
- ``rope_rebuilt``: post-processing that recomputes the rotary embedding's
  ``inv_freq`` buffer as a new tensor (a bug: the graph keeps the old one);
- a quantized model's loader quantizes the dense checkpoint tensor into the
  packed parameter of its name, in place (correct) or by binding a newly
  quantized parameter (``requantized``, a bug), as vLLM's online
  quantization does in its weight loaders.

The libraries are imported where a model is built, so this module imports
without them; ``need()`` skips a case whose library is missing.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

import reloadsafe

from real_layers import first_forward_repacked, refill_quant_state

VOCAB = 128
#: the forward's input: token ids [batch 1, 8 tokens]
SEQ = 8


def input_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _config(arch: str) -> Any:
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if arch == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                 num_experts=4, num_experts_per_tok=2)
    if arch == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    if arch in ("jetmoe", "jetmoe4"):
        # Sizes its experts' splits with tolist(), which no op makes. With 8
        # experts new weights change which experts get tokens (the ops); with
        # 4 every expert gets some, and only the split sizes (the numbers the
        # ops are handed) change.
        return tf.JetMoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_key_value_heads=2, kv_channels=16, num_experts_per_tok=2,
                               num_local_experts=8 if arch == "jetmoe" else 4,
                               max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if arch == "gpt2":  # Conv1D projections, learned positions, dropout (eval: none drawn)
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                             bos_token_id=0, eos_token_id=0)
    if arch == "recurrent_gemma":  # every prefill binds its recurrent state to tensors it makes
        return tf.RecurrentGemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, lru_width=64,
                                       attention_window_size=16, block_types=["recurrent", "attention"],
                                       pad_token_id=0, bos_token_id=0, eos_token_id=0)
    if arch == "mamba":  # a sequential scan: a replay must run the forward's very kernels
        return tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2,
                              conv_kernel=4, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    if arch == "gemma3":
        # The multimodal model on text only: its forward clears image tokens
        # with `ids[mask] = 0`, a Python number PyTorch makes into a tensor
        # without an op.
        return tf.Gemma3Config(
            text_config=dict(**common, head_dim=16, sliding_window=16, pad_token_id=0, bos_token_id=0,
                             eos_token_id=0),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=32, patch_size=16),
            mm_tokens_per_image=4)
    if arch == "deepseek_v3":  # multi-head latent attention, routed and shared experts
        return tf.DeepseekV3Config(**{**common, "num_key_value_heads": 4}, kv_lora_rank=16, q_lora_rank=32,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                                   num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                                   n_group=1, topk_group=1)
    if arch == "gemma3n_text":
        # Gemma 3n's text model: its last two layers read the keys and values
        # the first two made (KV sharing), per-layer input embeddings, AltUp's
        # predictions and corrections, activation sparsity in the first two.
        return tf.Gemma3nTextConfig(**{**common, "num_hidden_layers": 4}, head_dim=16, sliding_window=16,
                                    num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2,
                                    activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
                                    vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
                                    laurel_rank=8, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    raise ValueError(f"unknown architecture {arch!r}")


def build_dense(arch: str) -> torch.nn.Module:
    """A new model of ``arch`` in float32, its initial weights from a fixed
    seed, in eval mode."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(_config(arch)).eval()


def forward(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits


def dense_layouts(arch: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The checkpoint of ``arch``: every parameter of the dense model (a tied
    weight once), with its shape and dtype."""
    return {n: (tuple(p.shape), p.dtype) for n, p in build_dense(arch).named_parameters()}


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The decoder's linear layers (attention and MLP projections, experts
    kept as linears); the embedding and the LM head stay dense, as
    quantized checkpoints keep them."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}" and n.rsplit(".", 1)[-1] != "gate"]


# --- loaders -----------------------------------------------------------------


def load_state_dict(model: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
    model.load_state_dict(ckpt, strict=False)


def load_assign(model: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
    model.load_state_dict({k: v.clone() for k, v in ckpt.items()}, strict=False, assign=True)


def rebuild_rope(model: torch.nn.Module) -> None:
    rope = model.model.rotary_emb
    rope.register_buffer("inv_freq", rope.inv_freq.clone(), persistent=False)


# torchao: every decoder linear's weight an Int8Tensor (Int8WeightOnlyConfig),
# made in the factory from the initial weights; the loader quantizes each
# dense checkpoint tensor the same way and refills the kept Int8Tensor's
# inner tensors (or binds the new one).


def _torchao_int8(weight: torch.Tensor) -> torch.Tensor:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight.detach().clone()
    quantize_(lin, Int8WeightOnlyConfig())
    return lin.weight


def _refill(old: Any, new: Any) -> None:
    if hasattr(old, "__tensor_flatten__"):
        for name in old.__tensor_flatten__()[0]:
            _refill(getattr(old, name), getattr(new, name))
        return
    old.copy_(new)


def build_torchao(arch: str) -> torch.nn.Module:
    model = build_dense(arch)
    for _, lin in _linears(model):
        lin.weight = torch.nn.Parameter(_torchao_int8(lin.weight), requires_grad=False)
    return model


def _load_quantized(model: torch.nn.Module, ckpt: Mapping[str, torch.Tensor],
                    quantized: Callable[[torch.nn.Module, torch.Tensor, bool], None], rebind: bool) -> None:
    """Every checkpoint tensor into the model: a decoder linear's weight
    through ``quantized(linear, dense, rebind)``, the rest copied."""
    linears = {f"{n}.weight": m for n, m in _linears(model)}
    with torch.no_grad():
        for name, t in ckpt.items():
            if name in linears:
                quantized(linears[name], t, rebind)
            else:
                model.get_parameter(name).copy_(t)


def _torchao_into(lin: torch.nn.Module, dense: torch.Tensor, rebind: bool) -> None:
    new = _torchao_int8(dense)
    if rebind:
        lin.weight = torch.nn.Parameter(new, requires_grad=False)
    else:
        _refill(lin.weight, new)


def load_torchao(model: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
    _load_quantized(model, ckpt, _torchao_into, rebind=False)


def load_torchao_requantized(model: torch.nn.Module, ckpt: Mapping[str, torch.Tensor]) -> None:
    _load_quantized(model, ckpt, _torchao_into, rebind=True)


# bitsandbytes: decoder linears replaced by Linear4bit (NF4) or Linear8bitLt
# (LLM.int8 without outliers), quantized from the initial weights by the
# parameters' own move to the device; the loader quantizes each dense
# checkpoint tensor as the parameter does and copies the codes and scales
# into the kept tensors (or binds a new parameter, quantized by .to()).


def _bnb_linear(lin: torch.nn.Linear, bits: int, weight: torch.Tensor) -> torch.nn.Module:
    import bitsandbytes as bnb

    out_f, in_f = lin.weight.shape
    if bits == 4:
        new = bnb.nn.Linear4bit(in_f, out_f, bias=lin.bias is not None, compute_dtype=torch.float32,
                                quant_type="nf4")
        new.weight = bnb.nn.Params4bit(weight.detach().clone(), requires_grad=False, quant_type="nf4", module=new)
    else:
        new = bnb.nn.Linear8bitLt(in_f, out_f, bias=lin.bias is not None, has_fp16_weights=False, threshold=0.0)
        new.weight = bnb.nn.Int8Params(weight.detach().clone(), requires_grad=False, has_fp16_weights=False)
    if lin.bias is not None:
        new.bias = torch.nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
    return new.to(weight.device)  # quantizes


def build_bnb(arch: str, bits: int) -> torch.nn.Module:
    model = build_dense(arch)
    for name, lin in _linears(model):
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, _bnb_linear(lin, bits, lin.weight))
    return model


def _bnb4_into(lin: torch.nn.Module, dense: torch.Tensor, rebind: bool) -> None:
    import bitsandbytes.functional as bnbf

    if rebind:
        lin.weight = _bnb_linear(torch.nn.Linear(dense.shape[1], dense.shape[0], bias=False), 4, dense).weight
        return
    w = lin.weight
    q, state = bnbf.quantize_4bit(dense.contiguous(), blocksize=w.blocksize, compress_statistics=w.compress_statistics,
                                  quant_type=w.quant_type, quant_storage=w.quant_storage)
    if first_forward_repacked(lin):
        # The layer's first forward repacked the weight for the CPU kernel
        # (AVX512-BF16 CPUs): the new codes are repacked the same way.
        q, state = bnbf._convert_weight_packed_for_cpu(q, state)
    w.data.copy_(q.view(w.dtype).reshape(w.shape))
    refill_quant_state(w.quant_state, state)


def _bnb8_into(lin: torch.nn.Module, dense: torch.Tensor, rebind: bool) -> None:
    import bitsandbytes.functional as bnbf

    if rebind:
        lin.weight = _bnb_linear(torch.nn.Linear(dense.shape[1], dense.shape[0], bias=False), 8, dense).weight
        return
    cb, scb, _ = bnbf.int8_vectorwise_quant(dense.contiguous())
    lin.weight.data.copy_(cb)
    # Before the first forward the scales are the parameter's; the first
    # forward hands them to the layer's matmul state (Linear8bitLt.init_8bit_state).
    scales = lin.weight.SCB if lin.weight.SCB is not None else lin.state.SCB
    scales.copy_(scb)


def load_bnb4(model, ckpt):
    _load_quantized(model, ckpt, _bnb4_into, rebind=False)


def load_bnb4_requantized(model, ckpt):
    _load_quantized(model, ckpt, _bnb4_into, rebind=True)


def load_bnb8(model, ckpt):
    _load_quantized(model, ckpt, _bnb8_into, rebind=False)


def load_bnb8_requantized(model, ckpt):
    _load_quantized(model, ckpt, _bnb8_into, rebind=True)


# --- the cases ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    arch: str
    build: Callable[[], torch.nn.Module]
    load: Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], None] = load_state_dict
    process: Callable[[torch.nn.Module], None] | None = None
    #: None: a correct reload; else a name (prefix) that must be flagged
    expected: str | None = None
    library: str | None = None  # besides transformers
    #: the dense checkpoint's layouts, drawn from (quantized models: the
    #: parameters hold packed forms, not what a checkpoint holds)
    dense_checkpoint: bool = False
    #: check_reload's seed (its checkpoints and input)
    seed: int = 1

    def kwargs(self) -> dict[str, Any]:
        """check_reload's arguments for this case (besides layer and input)."""
        kw: dict[str, Any] = dict(load=self.load, forward=forward, name=self.name, seed=self.seed)
        if self.process is not None:
            kw["process"] = self.process
        if self.dense_checkpoint:
            layouts = dense_layouts(self.arch)
            kw["make_checkpoint"] = lambda seed: reloadsafe.draw_checkpoint(layouts, seed)
        return kw


def _bfloat16(arch: str) -> torch.nn.Module:
    return build_dense(arch).to(torch.bfloat16)


def _compiled(arch: str, backend: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        model = build_dense(arch)
        model.compile(backend=backend)
        return model

    return make


ARCHS = ("llama", "qwen3", "qwen2_moe", "mixtral", "jetmoe", "jetmoe4", "gpt2", "recurrent_gemma", "mamba", "gemma3",
         "deepseek_v3", "gemma3n_text")
#: the architectures with a rotary embedding (rope_rebuilt applies)
ROTARY = ("llama", "qwen3", "qwen2_moe", "mixtral")


def cases() -> list[ModelCase]:
    out: list[ModelCase] = []
    for arch in ARCHS:
        dense = lambda arch=arch: build_dense(arch)  # noqa: E731
        embedding = {"gpt2": "transformer.wte.weight", "mamba": "backbone.embeddings.weight",
                     "gemma3": "model.language_model.embed_tokens.weight"}.get(arch, "model.embed_tokens.weight")
        # JetMoE with 4 experts from the seed whose checkpoints keep every
        # expert busy, so only the experts' split sizes change (seed 1's and
        # 2's route another way: the op sequence changes, as for 8 experts).
        seed = 3 if arch == "jetmoe4" else 1
        out += [
            ModelCase(f"{arch}", arch, dense, seed=seed),
            ModelCase(f"{arch}-assign", arch, dense, load=load_assign, expected=embedding),
        ]
        if arch in ROTARY:
            out.append(ModelCase(f"{arch}-rope_rebuilt", arch, dense, process=rebuild_rope,
                                 expected="model.rotary_emb.inv_freq"))
    # bfloat16, the dtype engines serve in: the checkpoints are drawn in it
    # and the outputs compared in it.
    for arch in ("llama", "gpt2"):
        out.append(ModelCase(f"{arch}-bf16", arch, functools.partial(_bfloat16, arch)))
    for backend in ("eager", "aot_eager", "inductor"):
        out += [
            ModelCase(f"llama-compiled-{backend}", "llama", _compiled("llama", backend)),
            ModelCase(f"llama-compiled-{backend}-assign", "llama", _compiled("llama", backend), load=load_assign,
                      expected="model.embed_tokens.weight"),
        ]
    # MoE layers compiled as a user checks them on a CPU (aot_eager traces
    # every op): functionalized scatters into empty() (Qwen2-MoE), each
    # expert's slice of the fused weights read through a view no op is handed
    # the index of (Mixtral), a graph broken at tolist() and compiled again
    # for new split sizes (JetMoE).
    for arch in ("qwen2_moe", "mixtral", "jetmoe"):
        out.append(ModelCase(f"{arch}-compiled-aot_eager", arch, _compiled(arch, "aot_eager")))
    q = "model.layers.0.self_attn.q_proj.weight"
    out += [
        ModelCase("llama-torchao", "llama", lambda: build_torchao("llama"), load=load_torchao,
                  library="torchao", dense_checkpoint=True),
        ModelCase("llama-torchao-requantized", "llama", lambda: build_torchao("llama"),
                  load=load_torchao_requantized, expected=f"{q}.qdata", library="torchao", dense_checkpoint=True),
        ModelCase("llama-bnb4", "llama", lambda: build_bnb("llama", 4), load=load_bnb4,
                  library="bitsandbytes", dense_checkpoint=True),
        ModelCase("llama-bnb4-requantized", "llama", lambda: build_bnb("llama", 4), load=load_bnb4_requantized,
                  expected=q, library="bitsandbytes", dense_checkpoint=True),
        ModelCase("llama-bnb8", "llama", lambda: build_bnb("llama", 8), load=load_bnb8,
                  library="bitsandbytes", dense_checkpoint=True),
        ModelCase("llama-bnb8-requantized", "llama", lambda: build_bnb("llama", 8), load=load_bnb8_requantized,
                  expected=q, library="bitsandbytes", dense_checkpoint=True),
    ]
    return out


def need(case: ModelCase) -> None:
    """In a test: skip, naming the library, when ``case`` needs one that is
    not installed."""
    import pytest

    pytest.importorskip("transformers", reason="whole-model checks need transformers (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)")
    if case.library is not None:
        pytest.importorskip(case.library, reason=f"{case.name} needs {case.library} (not in this environment: pip install it; the main test environment tools/setup.sh makes has it)")
