"""The C++ reference utilities on Python tensors: results are views on the
caller's storages (no copies), errors are Python exceptions with the C++
message."""
import warnings

import pytest
import torch

import reloadsafe


def test_in_own_storage_places_an_equal_size_repack_at_the_old_address():
    old = torch.arange(16, dtype=torch.uint8)
    new = torch.arange(4, dtype=torch.int32)
    placed = reloadsafe.in_own_storage(old, new)
    assert placed.data_ptr() == old.data_ptr()
    assert placed.untyped_storage().data_ptr() == old.untyped_storage().data_ptr()
    assert placed.dtype == torch.int32 and placed.shape == (4,)
    assert torch.equal(placed, new)
    assert old.untyped_storage().nbytes() == 16


def test_in_own_storage_returns_new_when_it_does_not_fit():
    old = torch.zeros(4, dtype=torch.uint8)
    new = torch.ones(8, dtype=torch.uint8)
    before = old.clone()
    out = reloadsafe.in_own_storage(old, new)
    assert out is new  # the caller's tensor object, not a copy or a new wrapper
    assert torch.equal(old, before)


def test_in_own_storage_whole_storage_takes_a_larger_tensor():
    base = torch.zeros(32, dtype=torch.uint8)
    old = base[:16]
    new = torch.ones(24, dtype=torch.uint8)
    assert reloadsafe.in_own_storage(old, new).data_ptr() == new.data_ptr()
    placed = reloadsafe.in_own_storage(old, new, whole_storage=True)
    assert placed.data_ptr() == base.data_ptr() and torch.equal(placed, new)
    assert base.untyped_storage().nbytes() == 32


def _legacy_storage(t: torch.Tensor) -> torch.TypedStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated, still in use
        return t.storage()


@pytest.mark.parametrize(
    "source",
    [lambda t: t.untyped_storage(), lambda t: t, _legacy_storage, lambda t: t[4:]],
    ids=["untyped storage", "tensor", "typed storage", "view at an offset"],
)
def test_storage_view_from_a_storage_or_a_tensor(source):
    t = torch.arange(12, dtype=torch.float32)
    v = reloadsafe.storage_view(source(t), 2, [2, 3], [3, 1], torch.float32)
    assert v.data_ptr() == t.data_ptr() + 8  # offsets count from the storage's start
    assert v.tolist() == [[2, 3, 4], [5, 6, 7]]
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    w = reloadsafe.storage_view(source(t), 0, [3], [1], torch.int32)
    assert w.data_ptr() == t.data_ptr()


def test_storage_view_that_would_grow_the_storage_is_refused():
    t = torch.zeros(4)
    with pytest.raises(RuntimeError) as e:
        reloadsafe.storage_view(t, 2, [4], [1], torch.float32)
    assert "Exception raised from" not in str(e.value)  # the message, not a C++ backtrace
    assert t.untyped_storage().nbytes() == 16


def test_storage_view_type_errors():
    with pytest.raises(TypeError, match="torch.UntypedStorage or a tensor"):
        reloadsafe.storage_view([1, 2], 0, [1], [1], torch.float32)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        reloadsafe.storage_view(torch.zeros(1), 0, [1], [1], "float32")


@pytest.mark.parametrize(
    "shape,stride,expected",
    [((4, 4), (1, 4), 16), ((2, 3), (3, 1), 6), ((0, 5), (5, 1), 0), ((3, 2), (0, 1), 2), ((2, 2), (4, 1), 6)],
)
def test_extent_matches_checked_extent_and_the_formula(shape, stride, expected):
    t = torch.empty_strided(shape, stride)
    assert reloadsafe.extent(t) == expected
    assert reloadsafe.checked_extent(shape, stride) == expected


def test_checked_extent_overflow_and_bad_input():
    assert reloadsafe.checked_extent([2**40, 2**40], [2**40, 1]) is None
    with pytest.raises(RuntimeError):
        reloadsafe.checked_extent([2, 2], [1])


def test_extent_type_error():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        reloadsafe.extent([1, 2, 3])


def test_direct_reload_flag_is_scoped_and_restored_on_error():
    assert not reloadsafe.direct_reload_enabled()
    with reloadsafe.direct_reload():
        assert reloadsafe.direct_reload_enabled()
        with reloadsafe.direct_reload(False):
            assert not reloadsafe.direct_reload_enabled()
        assert reloadsafe.direct_reload_enabled()
    assert not reloadsafe.direct_reload_enabled()
    with pytest.raises(KeyError), reloadsafe.direct_reload():
        raise KeyError("boom")
    assert not reloadsafe.direct_reload_enabled()
