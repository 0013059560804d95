"""check_engine on vLLM's engine with a hybrid model (Granite 4: a Mamba-2
layer and an attention layer), on the CPU.

vLLM's Mamba-2 mixer registers ``conv_weights``, a buffer that is a view of
its ``conv1d.weight``, and its kernels read the buffer. On a CPU with
AVX512-BF16 (or Arm bf16) vLLM 0.32's CPU build prepacks the causal
convolution's weight after loading by rebinding ``conv1d.weight.data``
(``dispatch_cpu_unquantized_gemm``): the buffer keeps viewing the old storage,
which held the first load's values. A reload then writes the new weights
into the parameter and the buffer keeps the first load's
(``test_vllm_bug_cpu_mamba_conv_weights_keep_the_first_load``). A sync that
refreshes the buffer from the layer's unpacked copy passes.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_models import SKIP, engine

if SKIP:
    pytest.skip(SKIP, allow_module_level=True)

from reloadsafe import vllm_engine as ve  # noqa: E402

RELOADS = 2


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with engine("granite4h", str(tmp_path_factory.mktemp("granite4h"))) as built:
        yield built


def mixers_with_packed_conv(model: Any) -> list[Any]:
    """The Mamba mixers whose conv1d weight vLLM prepacked (keeping an
    unpacked copy for its fallbacks)."""
    return [m for m in model.modules()
            if hasattr(m, "conv_weights") and hasattr(getattr(m, "conv1d", None), "_cpu_unpacked_conv_weight")]


def refresh_conv_weights(worker: Any) -> None:
    """On a worker: each mixer's conv_weights refilled, in place, from the
    unpacked copy the post-processing of the reload made."""
    for mixer in mixers_with_packed_conv(worker.model_runner.model):
        mixer.conv_weights.copy_(mixer.conv1d._cpu_unpacked_conv_weight)


def reload_and_refresh(llm: Any, checkpoint: ve.EngineCheckpoint) -> None:
    ve.reload_from_iterator(llm, checkpoint)
    llm.collective_rpc(refresh_conv_weights)


def test_vllm_bug_cpu_mamba_conv_weights_keep_the_first_load(llm: Any) -> None:
    packed = mixers_with_packed_conv(ve.model_runner_of(llm).model)
    report = ve.check_engine(llm, ve.reload_from_iterator, reloads=RELOADS)
    if not packed:
        # This CPU has no bf16 convolution kernel: the weight is not
        # prepacked, the buffer still views it, and the reload is right.
        assert report.ok, report.format()
        return
    assert not report.ok
    for reload in report.reloads:
        assert any(v.startswith("model.layers.0.mamba.conv_weights: its bytes after the sync are not a fresh "
                                "engine's") and "kept its bytes from before the sync" in v
                   for v in reload.violations), report.format()


def test_sync_that_refreshes_conv_weights_passes(llm: Any) -> None:
    report = ve.check_engine(llm, reload_and_refresh, reloads=RELOADS)
    assert report.ok, report.format()
    assert all(r.logprob_difference < 1e-3 for r in report.reloads), report.format()
