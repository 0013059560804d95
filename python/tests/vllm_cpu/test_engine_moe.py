"""check_engine on vLLM's engine with a MoE model (GLM-4 MoE shape), on the CPU.

The gate's ``e_score_correction_bias`` is the routed experts' too (one
Parameter under two names); a correct sync loads it once for both.

vLLM 0.32's CPU build breaks every reload of unquantized experts
(``test_vllm_bug_cpu_experts_reload_skips_prepack``): a first load prepacks
``w13_weight`` and ``w2_weight`` into the CPU kernel's layout
(``CPUUnquantizedExperts.process_weights_after_loading``), but a reload
copies the checkpoint-layout weights into them and, its MoE kernel being set
up already, skips the prepack (``UnquantizedFusedMoEMethod._setup_kernel``):
the kernel reads plain weights as packed ones. A sync that prepacks again
after ``reload_weights`` (``reload_and_prepack``, what a worker extension
can do until vLLM does) passes; on top of it, a planted stale expert map is
flagged with the experts that swapped.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_models import SKIP, engine, expert_permuted

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

from reloadsafe import vllm_engine as ve  # noqa: E402

RELOADS = 2
EXPERTS = "model.layers.1.mlp.experts.routed_experts"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with engine("glm4moe", str(tmp_path_factory.mktemp("glm4moe"))) as built:
        yield built


def prepack_experts(worker: Any) -> None:
    """On a worker: the CPU experts' weights prepacked again, in place."""
    from vllm._custom_ops import cpu_prepack_moe_weight

    for module in worker.model_runner.model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        isa = getattr(getattr(kernel, "fused_experts", None), "isa", None)
        if isa is None or not hasattr(module, "w13_weight"):
            continue
        for name in ("w13_weight", "w2_weight"):
            weight = getattr(module, name)
            weight.data.copy_(cpu_prepack_moe_weight(weight.data, isa))


def reload_and_prepack(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
    ve.reload_from_iterator(llm, checkpoint)
    llm.collective_rpc(prepack_experts)


def test_vllm_bug_cpu_experts_reload_skips_prepack(llm: Any) -> None:
    report = ve.check_engine(llm, ve.reload_from_iterator, reloads=RELOADS)
    assert not report.ok
    for reload in report.reloads:
        text = "\n".join(reload.violations)
        for name in ("w13_weight", "w2_weight"):
            assert f"{EXPERTS}.{name}: its bytes after the sync are not a fresh engine's" in text, report.format()
        assert "model.layers.1.mlp.experts: output differs from a fresh engine's" in text, report.format()
        # The shared bias is loaded for both names, the dense layer and the
        # attention are a fresh engine's: only the experts are named.
        assert all("experts" in v for v in reload.violations), report.format()


def test_sync_that_prepacks_again_passes(llm: Any) -> None:
    report = ve.check_engine(llm, reload_and_prepack, reloads=RELOADS)
    assert report.ok, report.format()
    assert all(r.logprob_difference < 1e-3 for r in report.reloads), report.format()


def test_stale_expert_map_names_the_swapped_experts(llm: Any) -> None:
    permuted = expert_permuted({0: 1, 1: 0})

    def stale_map(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": permuted(checkpoint)})
        llm.collective_rpc(prepack_experts)

    report = ve.check_engine(llm, stale_map, reloads=RELOADS)
    assert not report.ok
    text = "\n".join(report.reloads[0].violations)
    assert f"{EXPERTS}.w13_weight:" in text, report.format()
    assert "2 of its 4 slices along the first dimension (experts) differ: 0, 1; 0 holds 1's, 1 holds 0's" in text, \
        report.format()
