#!/usr/bin/env python3
"""check_reload over many Hugging Face architectures, each reloaded the
correct way (``load_state_dict`` into the model's own parameters): every one
should pass. A maintainer's search for false alarms and errors on real code,
not a test: the configs are tiny, built here without a download, and some
architectures reject them (their own forward raises; the check says so).

    PYTHONPATH=bazel-bin/python/package_site python tools/hf_sweep.py [--bf16] [--compile BACKEND] [ARCH ...]

With no ARCH, every decoder-only architecture transformers maps to a causal
LM. One line per architecture: ``ok``, the names flagged, ``error`` with the
check's message, or ``refused`` where the model or its config raised before
a check could start (not the check's finding). Exit status 1 if any
architecture was flagged or ended in an error.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import time
import warnings
from typing import Any

import torch

VOCAB = 128
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, bos_token_id=0, eos_token_id=0)
# What the common keys do not reach (other names, or sizes that must agree).
EXTRA: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "ctrl": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, dff=128),  # its default: 1.6 B parameters
    "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8),
    "codegen": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "bloom": dict(n_head=4, n_layer=2),
    "mpt": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64),
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
    "xglm": dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128),
    "falcon": dict(num_kv_heads=2, new_decoder_architecture=True),
    "gemma": dict(head_dim=16), "gemma2": dict(head_dim=16),
    "gemma3_text": dict(head_dim=16, sliding_window=16),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "jetmoe": dict(kv_channels=16),
    # Its attention has as many key/value heads as query heads: with fewer, its
    # compiled SDPA gets mismatched shapes (eager passes).
    "longcat_flash": dict(num_layers=2, num_key_value_heads=4, ffn_hidden_size=128, q_lora_rank=32,
                          kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=16,
                          moe_topk=2, n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=32),
    "mamba": dict(state_size=8, expand=2, conv_kernel=4),
    # Linear-attention hybrids whose default pattern puts no full attention layer
    # in the first two (their own mask then raises); their attention needs as
    # many key/value heads as query heads.
    "kimi_linear": dict(layer_types=["linear_attention", "full_attention"], num_key_value_heads=4,
                        num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "bailing_hybrid": dict(layer_types=["linear_attention", "full_attention"], num_key_value_heads=4,
                           num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    # Its own names, nested attention and expert configs (rope_theta and clip_qkv
    # have no usable default there).
    "dbrx": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64,
                 attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2)),
    # Its indexer may use at most as many heads as one key head has query heads
    # (2 here; 12 by default).
    "kolibri1_1": dict(index_num_heads=2),
    # Its attention wants as many key/value heads as query heads; 256 experts
    # by default.
    "dots3_note_text": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, shared_experts_intermediate_size=32, index_topk=4),
    # Its rotary parameters are keyed by layer type, with no default for one.
    "cohere_compass_text": dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    # A decoder only when told so; its axial position embeddings must add up to
    # the hidden size, its chunks divide the input's 8 tokens.
    "reformer": dict(is_decoder=True, axial_pos_embds_dim=[16, 48], axial_pos_shape=[8, 8],
                     attn_layers=["local", "lsh"], attention_head_size=16, feed_forward_size=128,
                     local_attn_chunk_length=8, lsh_attn_chunk_length=8),
    # Its own forward with the default cache mis-shapes the chunkwise state;
    # without the cache it runs.
    "xlstm": dict(num_heads=4, num_blocks=2, chunk_size=8, use_cache=False),
    # No head_dim default of their own (None: their attention cannot scale), or
    # helium's 128 against the common hidden size.
    "ministral": dict(head_dim=16), "helium": dict(head_dim=16), "hunyuan_v1_dense": dict(head_dim=16),
    "hunyuan_v1_moe": dict(head_dim=16, num_experts=4, moe_topk=2),
    # No expert count or layer pattern by default.
    "dots1": dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                  first_k_dense_replace=1),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, num_dense_layers=1),
    # Four layers, the last two reading the first two's keys and values (its
    # default shares them from layer 15 on, which two layers cannot hold), the
    # first two with its activation sparsity, and its per-layer input
    # embeddings (262144 x 256 per layer at their defaults) small.
    "gemma3n_text": dict(num_hidden_layers=4, num_kv_shared_layers=2, head_dim=16, sliding_window=16,
                         layer_types=["sliding_attention", "full_attention"] * 2,
                         activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
                         vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16, laurel_rank=8),
    # Its vision and audio towers, which a forward on text does not run, are
    # nested configs of their own (870 M parameters at their defaults).
    "phi4_multimodal": dict(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, image_size=28, patch_size=14, crop_size=28),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=4,
                          ext_pw_out_channel=32, depthwise_separable_out_channel=32,
                          nemo_conv_channels=32)),
    # Four nested configs the common keys do not reach (built at 4.6 B parameters
    # otherwise), sized so that the encoder's cross output (hidden x cross_attn_k)
    # is the global model's width, as in the released ones. Its cache cannot be
    # built from the top-level config (no num_hidden_layers): forwards without it.
    "blt": dict(encoder_hash_byte_group_vocab=64, use_cache=False,
                patcher_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64),
                encoder_config=dict(hidden_size=32, hidden_size_global=64, num_attention_heads=4,
                                    num_hidden_layers=1, intermediate_size=64),
                decoder_config=dict(hidden_size=32, hidden_size_global=64, num_attention_heads=4,
                                    num_hidden_layers=2, intermediate_size=64),
                global_config=dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                   intermediate_size=128)),
    # Hybrids: two layers must hold one attention layer, or their own
    # forward raises (no attention cache to size the mask from).
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                  num_experts=4, num_experts_per_tok=2, mamba_d_state=8),
    "granitemoehybrid": dict(layer_types=["linear_attention", "attention"], num_local_experts=4,
                             num_experts_per_tok=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8,
                             mamba_n_groups=1, mamba_chunk_size=8),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], num_experts=4, num_experts_per_tok=2,
                       head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "qwen3_5_moe_text": dict(layer_types=["linear_attention", "full_attention"], num_experts=4,
                             num_experts_per_tok=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32),
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"], head_dim=16, linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4),
    # Its full attention layers are indexed (a sparse-attention indexer with no
    # default sizes), its n-gram embeddings sized from a 20 M vocabulary.
    "qwen4_exp_text": dict(layer_types=["linear_attention", "full_attention"], num_experts=4, num_experts_per_tok=2,
                           head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=4, shared_expert_intermediate_size=32, moe_intermediate_size=32,
                           indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                           indexer_compress_ratio=2, ngram_vocab_size_base=256, split_ngram_parts=4,
                           heads_per_ngram=2),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_n_groups=1,
                  mamba_chunk_size=8),
    # Its hybrid layers share one transformer block (tied weights), which needs
    # two of them.
    "zamba": dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid"] * 2, mamba_d_state=8),
    "mamba2": dict(num_heads=4, head_dim=32, state_size=8, n_groups=1, chunk_size=8, expand=2),
    "zamba2": dict(layers_block_type=["mamba", "hybrid"], mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=1,
                   chunk_size=8),
    "recurrent_gemma": dict(head_dim=16, lru_width=64, attention_window_size=16,
                            block_types=["recurrent", "attention"]),
}
# Multi-head latent attention (DeepSeek-V3 and the models built like it):
# small ranks and head sizes that agree, each architecture taking the keys
# its config knows. As many key/value heads as query heads: with fewer, their
# own forward (or its compiled SDPA) gets mismatched shapes.
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           first_k_dense_replace=1, n_group=1, topk_group=1, index_head_dim=16, index_n_heads=2, index_topk=4)
MLA_ARCHS = {"axk1", "axk2", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "minicpm3",
             "sarvam_mla", "youtu"}
# Encoder-decoder and encoder models transformers also maps to a causal LM:
# their forward wants more than token ids.
SKIP = {"bart", "bert", "bert-generation", "big_bird", "bigbird_pegasus", "blenderbot", "blenderbot-small",
        "camembert", "data2vec-text", "electra", "ernie", "marian", "mbart", "megatron-bert", "mvp",
        "pegasus", "plbart", "prophetnet", "rembert", "roberta", "roberta-prelayernorm", "roc_bert",
        "roformer", "trocr", "whisper", "xlm", "xlm-roberta", "xlm-roberta-xl", "xlnet", "xmod"}


def _small_kwargs(cls: Any, model_type: str) -> dict[str, Any]:
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in SMALL.items() if k in accepted}
    if model_type in MLA_ARCHS:
        kwargs.update({k: v for k, v in MLA.items() if k in accepted})
    kwargs.update(EXTRA.get(model_type, {}))
    return kwargs


def config(arch: str) -> Any:
    """A tiny config of `arch`. A multimodal architecture's causal LM is its
    text model, whose config is nested (``text_config``): that one is made
    tiny too, or the model is built at its full size."""
    import transformers as tf

    cls = tf.CONFIG_MAPPING[arch]
    kwargs = _small_kwargs(cls, arch)
    try:
        text = getattr(cls(), "text_config", None)
    except Exception:  # a config without defaults for every key: no nested text config to find
        text = None
    if text is not None and "text_config" not in kwargs:
        kwargs["text_config"] = _small_kwargs(type(text), text.model_type)
    return cls(**kwargs)


def sweep(arch: str, bf16: bool, backend: str | None = None) -> tuple[str, bool]:
    """One architecture's line, and whether it counts as a failure."""
    import transformers as tf

    from reloadsafe import ReloadCheckError, check_reload

    try:
        cfg = config(arch)

        def build() -> torch.nn.Module:
            torch.manual_seed(0)
            model = tf.AutoModelForCausalLM.from_config(cfg).eval()
            model = model.to(torch.bfloat16) if bf16 else model
            if backend is not None:
                model.compile(backend=backend)
            return model

        build()
    except Exception as e:  # the model or its config, before any check
        return f"refused  {type(e).__name__}: {str(e).splitlines()[0][:160]}", False
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    if backend is not None:
        torch._dynamo.reset()
    start = time.perf_counter()
    try:
        report = check_reload(build, ids, reloads=3, name=arch,
                              load=lambda m, ckpt: m.load_state_dict(ckpt, strict=False),
                              forward=lambda m, x: m(x).logits)
    except ReloadCheckError as e:
        return f"refused  {str(e).splitlines()[0][:200]}", False
    took = f"{time.perf_counter() - start:.1f} s"
    if report.errors:
        return f"error    {took}  {'; '.join(report.errors)[:200]}", True
    if not report.ok:
        return f"flagged  {took}  {', '.join(report.flagged)}", True
    warned = {w["message"].split(" (")[0] for m in report.modes.values() for w in m["warnings"]}
    return f"ok       {took}" + (f"  warned: {'; '.join(sorted(warned))}" if warned else ""), False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archs", nargs="*")
    parser.add_argument("--bf16", action="store_true", help="the models in bfloat16")
    parser.add_argument("--compile", metavar="BACKEND", help="each model compiled with this torch.compile "
                        "backend (aot_eager traces every op of the graph)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = args.archs or [a for a in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if a not in SKIP]
    failed = 0
    for arch in archs:
        line, bad = sweep(arch, args.bf16, args.compile)
        failed += bad
        print(f"{arch:24} {line}", flush=True)
    print(f"{len(archs)} architectures, {failed} flagged or in error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
