"""The safetensors file loader on Python tensors: files written by the
``safetensors`` package land byte for byte in the caller's tensors, at their
addresses; mismatches are refused before any write."""
from __future__ import annotations

import pytest
import torch

import reloadsafe

safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture()
def checkpoint(tmp_path):
    torch.manual_seed(0)
    shard0 = {
        "embed.weight": torch.randn(300, 17).to(torch.bfloat16),
        "layer.0.bias": torch.randn(33),
        "layer.0.ids": torch.arange(1000),
    }
    shard1 = {
        "layer.1.weight": torch.randn(64, 129).to(torch.float16),
        "layer.1.mask": torch.rand(77) > 0.5,
    }
    paths = [tmp_path / "model-00001.safetensors", tmp_path / "model-00002.safetensors"]
    safetensors_torch.save_file(shard0, str(paths[0]))
    safetensors_torch.save_file(shard1, str(paths[1]))
    return paths, {**shard0, **shard1}


def test_every_byte_lands_at_the_tensors_addresses(checkpoint):
    paths, values = checkpoint
    dests = {name: torch.zeros_like(v) for name, v in values.items()}
    addresses = {name: (t.data_ptr(), t.untyped_storage().nbytes()) for name, t in dests.items()}
    loader = reloadsafe.SafetensorsLoader(threads=2, chunk_bytes=1000)
    for _ in range(2):
        written = loader.load_(paths, dests)
        assert written == sum(v.numel() * v.element_size() for v in values.values())
        for name, v in values.items():
            assert torch.equal(dests[name], v), name
            assert (dests[name].data_ptr(), dests[name].untyped_storage().nbytes()) == addresses[name]
    counters = loader.counters()
    assert counters["calls"] == 2 and counters["tensors_loaded"] == 10
    assert counters["staging_allocations"] == 0  # CPU destinations are read into directly


def test_parts_of_a_fused_parameter_by_byte_offset(tmp_path):
    q, k, v = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4, 16)
    path = tmp_path / "qkv.safetensors"
    safetensors_torch.save_file({"q": q, "k": k, "v": v}, str(path))
    qkv = torch.full((16, 16), 7.0)
    row = 16 * 4
    reloadsafe.load_safetensors_(path, {"q": (qkv, 0), "k": (qkv, 8 * row), "v": (qkv, 12 * row)})
    assert torch.equal(qkv, torch.cat([q, k, v]))


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (lambda d: d.update({"layer.0.bias": torch.zeros(33, dtype=torch.float64)}), "does not convert"),
        (lambda d: d.update({"layer.0.bias": torch.zeros(3, 11)}), "has shape"),
        (lambda d: d.update({"missing": torch.zeros(1)}), "'missing' is in none"),
        (lambda d: d.update({"embed.weight": torch.zeros(17, 300, dtype=torch.bfloat16).t()}),
         "not contiguous"),
        (lambda d: d.update({"layer.0.bias": (torch.zeros(40), 32)}), "does not fit"),
    ],
    ids=["dtype", "shape", "missing", "not contiguous", "offset past the end"],
)
def test_a_mismatch_is_refused_before_any_write(checkpoint, spoil, expected):
    paths, values = checkpoint
    dests = {name: torch.full_like(v, 3) if v.dtype != torch.bool else torch.ones_like(v)
             for name, v in values.items()}
    spoil(dests)
    before = {name: (t[0] if isinstance(t, tuple) else t).clone() for name, t in dests.items()}
    with pytest.raises(RuntimeError, match=expected):
        reloadsafe.SafetensorsLoader().load_(paths, dests)
    for name, t in dests.items():
        assert torch.equal(t[0] if isinstance(t, tuple) else t, before[name]), name


def test_a_malformed_file_is_refused(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    dest = torch.zeros(4)
    with pytest.raises(RuntimeError, match="bad.safetensors"):
        reloadsafe.load_safetensors_(path, {"x": dest})
    assert torch.equal(dest, torch.zeros(4))


def test_a_destination_that_is_not_a_tensor_is_a_type_error(checkpoint):
    paths, _ = checkpoint
    with pytest.raises(TypeError, match="layer.0.bias"):
        reloadsafe.load_safetensors_(paths, {"layer.0.bias": [1.0]})
