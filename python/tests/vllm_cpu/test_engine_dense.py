"""check_engine on vLLM's engine with a dense model (Qwen3 shape), on the CPU.

The syncs RL frameworks make pass: ``collective_rpc("reload_weights")``
from the checkpoint's folder and from a weight iterator, the iterator
streamed in parts through one call, and a worker extension calling the model
runner. Planted bugs are flagged by name: a sync that rebinds a parameter,
one that sends the checkpoint in separate reload calls (each finalizes the
layers it reached, before the rest of their tensors came), names renamed by
a compile wrapper (the sync loads nothing, or vLLM refuses them), and a sync
that keeps what it loaded alive.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_models import SKIP, engine, renamed_names, worker_reload

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

import torch  # noqa: E402

from reloadsafe import ReloadViolation  # noqa: E402
from reloadsafe import vllm_engine as ve  # noqa: E402

RELOADS = 2


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with engine("qwen3", str(tmp_path_factory.mktemp("qwen3"))) as built:
        yield built


@pytest.mark.parametrize("sync", [
    ve.reload_from_checkpoint,
    ve.reload_from_iterator,
    ve.reload_streamed(3),
    worker_reload,
], ids=lambda s: s.__name__)
def test_correct_sync_passes(llm: Any, sync: Any) -> None:
    report = ve.check_engine(llm, sync, reloads=RELOADS)
    assert report.ok, report.format()
    assert len(report.reloads) == RELOADS
    # It looked: reads held to their address, every reload's prompt
    # log-probabilities those of a fresh engine with the same checkpoint.
    assert report.held_reads > 50, report.format()
    assert all(r.logprob_difference < 1e-3 for r in report.reloads), report.format()


def test_rebound_parameter_is_named(llm: Any) -> None:
    def rebind(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
        ve.reload_from_iterator(llm, checkpoint)
        model = ve.model_runner_of(llm).model
        old = model.model.norm.weight
        model.model.norm.weight = torch.nn.Parameter(old.detach().clone(), requires_grad=False)

    report = ve.check_engine(llm, rebind, reloads=RELOADS)
    assert not report.ok
    for reload in report.reloads:
        assert [v for v in reload.violations if v.startswith("model.norm.weight: moved from")], report.format()
    # Only it: the values are a fresh engine's.
    assert all(len(r.violations) == 1 for r in report.reloads), report.format()
    with pytest.raises(ReloadViolation, match="model.norm.weight"):
        report.raise_for_violations()


def test_sync_in_separate_reload_calls_is_flagged(llm: Any) -> None:
    # Each reload_weights call finalizes the layers it touched: a fused layer
    # whose tensors span two calls is post-processed with half of them.
    def separate_calls(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
        for part in checkpoint.chunks(3):
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": part})

    report = ve.check_engine(llm, separate_calls, reloads=RELOADS)
    assert not report.ok
    first = report.reloads[0].violations
    assert any(v.startswith("model.layers.0.self_attn.qkv_proj: output differs from a fresh engine's")
               for v in first), report.format()


def test_renamed_names_that_load_nothing_are_flagged(llm: Any) -> None:
    report = ve.check_engine(llm, renamed_names, reloads=RELOADS)
    assert not report.ok
    first = report.reloads[0].violations
    assert any(v.startswith("model.embed_tokens.weight:") and "the sync did not load it" in v
               for v in first), report.format()


def test_sync_that_keeps_its_weights_alive_is_flagged(llm: Any) -> None:
    kept: list[Any] = []

    def hoarding(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
        ve.reload_from_iterator(llm, checkpoint)
        kept.append([t.clone() for _, t in checkpoint.items()])

    report = ve.check_engine(llm, hoarding, reloads=3)
    kept.clear()
    assert not report.ok
    assert any(v.startswith("memory: the tensors held grow with every reload") for v in report.overall), \
        report.format()
    # Nothing else: addresses and values are right.
    assert all(not r.violations for r in report.reloads), report.format()


def test_check_refuses_an_engine_it_cannot_reach() -> None:
    class NotAnEngine:
        llm_engine = None

    with pytest.raises(ve.ReloadCheckError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        ve.check_engine(NotAnEngine(), ve.reload_from_iterator)


# Last in the module: the sync leaves the engine unable to run.
def test_renamed_names_vllm_refuses_are_flagged(llm: Any) -> None:
    def prefixed(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
        sent = [("_orig_mod." + n, t) for n, t in checkpoint.items()]
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sent})

    report = ve.check_engine(llm, prefixed, reloads=RELOADS)
    assert not report.ok
    assert report.reloads[0].violations[0].startswith("the sync raised"), report.format()
    assert "_orig_mod" in report.reloads[0].violations[0], report.format()
    # vLLM left its layers mid-reload, on the meta device: the report says
    # so, and a later check refuses the engine instead of crashing in it.
    assert "on the meta device" in report.reloads[0].violations[0], report.format()
    with pytest.raises(ve.ReloadCheckError, match="(?s)warm-up step.*build a new LLM"):
        ve.check_engine(llm, ve.reload_from_iterator, reloads=1)
