"""The supported torch range: the build backend's checks before it runs Bazel
(what it tells a user whose environment has no torch, a torch out of range,
or a machine without the build's Debian packages), the import's refusal of a
torch other than the one the extension was built against, and deprecations
from our own code failing the tests."""
import importlib.metadata
import importlib.util
import pathlib
import subprocess
import sys
import warnings

import pytest

BACKEND = pathlib.Path(__file__).resolve().parents[1] / "build_backend" / "reloadsafe_build.py"


@pytest.fixture(scope="module")
def backend():
    spec = importlib.util.spec_from_file_location("reloadsafe_build", BACKEND)
    assert spec is not None and spec.loader is not None, BACKEND
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_range_is_read_from_the_libtorch_rule(backend):
    assert backend.supported_torch() == ((2, 11), (2, 15))
    assert backend.supported_torch("SUPPORTED_TORCH = ((2, 12), (3, 1))\n") == ((2, 12), (3, 1))
    with pytest.raises(backend.BuildError, match="no SUPPORTED_TORCH"):
        backend.supported_torch("nothing here\n")


@pytest.mark.parametrize("version, series", [
    ("2.11.0", (2, 11)), ("2.11.0+cu130", (2, 11)), ("2.14.0", (2, 14)), ("2.15.0+cu132", (2, 15)),
    ("2.15.1", (2, 15)),
])
def test_a_torch_in_the_range_is_accepted(backend, version, series):
    assert backend.check_torch(version, "/env/bin/python", ((2, 11), (2, 15))) == series


@pytest.mark.parametrize("version", ["2.10.0", "2.16.0", "1.13.1", "3.0.0", "nightly"])
def test_a_torch_outside_the_range_is_refused_with_what_to_install(backend, version):
    with pytest.raises(backend.BuildError) as e:
        backend.check_torch(version, "/env/bin/python", ((2, 11), (2, 15)))
    message = str(e.value)
    assert f"is {version}" in message
    assert "supports torch 2.11 to 2.15" in message
    assert "/env/bin/python -m pip install 'torch>=2.11,<2.16'" in message


def test_no_torch_says_to_install_one_first(backend):
    with pytest.raises(backend.BuildError, match=r"has none: install one first \(/env/bin/python -m pip install "
                                                 r"'torch>=2.11,<2.16'\)"):
        backend.check_torch(None, "/env/bin/python", ((2, 11), (2, 15)))


def test_the_torch_of_an_interpreter_is_read_without_importing_it(backend):
    import torch

    # The distribution's version, without the local part (+cu132).
    found = backend.target_torch(sys.executable, None)
    assert found == importlib.metadata.version("torch")
    assert torch.__version__.startswith(found)


def test_missing_debian_packages_are_named_in_one_command(backend, monkeypatch):
    needs = [("present-pkg", lambda: True), ("absent-a", lambda: False), ("absent-b", lambda: False)]
    assert backend.missing_debian_packages(needs) == ["absent-a", "absent-b"]
    monkeypatch.setattr(backend, "_DEBIAN_NEEDS", needs)
    monkeypatch.setattr(backend, "python_headers_missing", lambda python, env: False)
    with pytest.raises(backend.BuildError) as e:
        backend.check_machine(sys.executable, None)
    assert "apt-get install -y --no-install-recommends absent-a absent-b\n" in str(e.value)


def test_this_machine_has_what_the_build_needs(backend):
    # The tests run against a package Bazel built here, so nothing is missing.
    assert backend.missing_debian_packages() == []
    assert not backend.python_headers_missing(sys.executable, None)


def test_output_folders_are_kept_apart_per_torch_series(backend):
    assert backend.bazel_flags((2, 15)) == ["--platform_suffix=pip-torch2.15"]
    assert backend.bazel_flags((2, 11)) != backend.bazel_flags((2, 15))


def test_import_refuses_another_torch_and_says_how_to_rebuild():
    # The extension records the torch it was compiled against; an interpreter
    # whose torch reports another version must not load it.
    code = ("import torch\ntorch.__version__ = '2.99.0'\n"
            "try:\n    import reloadsafe\nexcept ImportError as e:\n    print(e)\n"
            "else:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "was built against torch" in out
    assert "imports torch 2.99.0" in out
    assert f"{sys.executable} -m pip install --force-reinstall --no-deps <reloadsafe checkout>/python" in out


def test_a_deprecation_warned_from_our_code_fails_the_test():
    # python/pyproject.toml turns deprecations attributed to reloadsafe's and
    # the tests' own modules into errors: a newer torch that deprecates what
    # we call (quantized tensor creation in 2.15) must fail the tests, not
    # print a warning.
    # stacklevel=1 (the default): the warnings must be attributed to this
    # module, which the filters match; a caller's module would not be.
    with pytest.raises(UserWarning, match="deprecated"):
        warnings.warn("torch.quantize_per_tensor is deprecated", UserWarning, stacklevel=1)
    with pytest.raises(DeprecationWarning):
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
