"""The C++ sources of the extension module reloadsafe._C, listed once for both
of its builds (the pattern of PyTorch's build_variables.bzl):

  - Bazel: python/BUILD.bazel loads this file; `_C.so` compiles the
    python/src/ entries itself and links the libraries that compile the rest
    (//utils, //conformance:case_runner, //conformance/harness:*,
    //conformance/trace:*). `extension_sources_test` (python/BUILD.bazel)
    fails when what those targets compile and include differs from these
    lists, in either direction.
  - setuptools: python/setup.py reads the lists as Python literals and hands
    them to torch.utils.cpp_extension (`pip install ./python`); its sdist
    carries exactly these files.

Paths are relative to the repository root. Keep every value a plain list of
string literals: setup.py parses this file with Python's `ast`, not Bazel.
When you add a C++ file to one of those targets, add it here too.
"""

# Compiled on every machine.
EXTENSION_SOURCES = [
    "conformance/case_json.cc",
    "conformance/case_report.cc",
    "conformance/case_runner.cc",
    "conformance/case_tensors.cc",
    "conformance/harness/checkpoint_pools.cc",
    "conformance/harness/cold_loads.cc",
    "conformance/harness/cold_start.cc",
    "conformance/harness/device_graph.cc",
    "conformance/harness/digest.cc",
    "conformance/harness/forward_capture.cc",
    "conformance/harness/forward_checks.cc",
    "conformance/harness/internal/all_close.cc",
    "conformance/harness/layer_life.cc",
    "conformance/harness/layer_state.cc",
    "conformance/harness/mode_memory.cc",
    "conformance/harness/protocol.cc",
    "conformance/harness/reload_steps.cc",
    "conformance/harness/report.cc",
    "conformance/harness/report_format.cc",
    "conformance/harness/step_table.cc",
    "conformance/harness/steps/cold_footprint.cc",
    "conformance/harness/steps/compare_forward_state.cc",
    "conformance/harness/steps/compare_state.cc",
    "conformance/harness/steps/host_numbers.cc",
    "conformance/harness/steps/load_from_file.cc",
    "conformance/harness/steps/load_per_tensor.cc",
    "conformance/harness/steps/recreate_parameters.cc",
    "conformance/harness/steps/reload_peak.cc",
    "conformance/harness/steps/sleep.cc",
    "conformance/harness/values.cc",
    "conformance/harness/violation_sink.cc",
    "conformance/ops/copy_weight.cc",
    "conformance/ops/extent.cc",
    "conformance/ops/get_moe_expert_mapping.cc",
    "conformance/ops/in_own_storage.cc",
    "conformance/ops/layer_script.cc",
    "conformance/ops/operations.cc",
    "conformance/ops/refill_derived.cc",
    "conformance/ops/replace_parameter.cc",
    "conformance/ops/set_weight_attrs.cc",
    "conformance/ops/storage_view.cc",
    "conformance/ops/weights_already_processed.cc",
    "conformance/trace/capture.cc",
    "conformance/trace/internal/call_match.cc",
    "conformance/trace/internal/call_state.cc",
    "conformance/trace/internal/object_tensors.cc",
    "conformance/trace/internal/op_names.cc",
    "conformance/trace/internal/unfilled_memory.cc",
    "conformance/trace/memory_census.cc",
    "conformance/trace/read_trace.cc",
    "conformance/trace/sparse_parts.cc",
    "conformance/trace/tensor_location.cc",
    "python/src/bind_file_loader.cc",
    "python/src/bind_protocol.cc",
    "python/src/bind_reference.cc",
    "python/src/bind_trace.cc",
    "python/src/module.cc",
    "utils/copy_weight.cc",
    "utils/crossover_rule.cc",
    "utils/dense_copy.cc",
    "utils/file_loader.cc",
    "utils/layer.cc",
    "utils/parameter_names.cc",
    "utils/reload_context.cc",
    "utils/replace_parameter.cc",
    "utils/safetensors_header.cc",
    "utils/safetensors_writer.cc",
    "utils/storage_fit.cc",
    "utils/tensor_attrs.cc",
]

# Compiled where a CUDA Toolkit is found (Bazel: rs_cuda_library, empty
# without one; setuptools: torch.utils.cpp_extension.CUDA_HOME). CUDA host
# code only: no .cu files, so g++ compiles it.
EXTENSION_CUDA_SOURCES = [
    "conformance/harness/device_graph_cuda.cc",
]

# Included by the sources above (headers and .inc fragments): not compiled on
# their own, but part of the sdist and of the drift test.
EXTENSION_HEADERS = [
    "conformance/case_json.h",
    "conformance/case_report.h",
    "conformance/case_runner.h",
    "conformance/case_tensors.h",
    "conformance/harness/checkpoint_pools.h",
    "conformance/harness/cold_loads.h",
    "conformance/harness/cold_start.h",
    "conformance/harness/device_graph.h",
    "conformance/harness/digest.h",
    "conformance/harness/forward_capture.h",
    "conformance/harness/forward_checks.h",
    "conformance/harness/internal/all_close.h",
    "conformance/harness/internal/parallel_items.h",
    "conformance/harness/layer_life.h",
    "conformance/harness/layer_state.h",
    "conformance/harness/mode_memory.h",
    "conformance/harness/protocol.h",
    "conformance/harness/reload_steps.h",
    "conformance/harness/report.h",
    "conformance/harness/report_format.h",
    "conformance/harness/run_options.h",
    "conformance/harness/step.h",
    "conformance/harness/step_table.h",
    "conformance/harness/subject.h",
    "conformance/harness/values.h",
    "conformance/harness/violation_sink.h",
    "conformance/ops/operation.h",
    "conformance/ops/operations.inc",
    "conformance/trace/capture.h",
    "conformance/trace/internal/call_match.h",
    "conformance/trace/internal/call_state.h",
    "conformance/trace/internal/object_tensors.h",
    "conformance/trace/internal/op_arguments.h",
    "conformance/trace/internal/op_names.h",
    "conformance/trace/internal/unfilled_memory.h",
    "conformance/trace/memory_census.h",
    "conformance/trace/named_tensor.h",
    "conformance/trace/read_trace.h",
    "conformance/trace/sparse_parts.h",
    "conformance/trace/tensor_location.h",
    "conformance/trace/trace_key.h",
    "conformance/trace/trace_records.h",
    "python/src/bindings.h",
    "utils/copy_weight.h",
    "utils/crossover_rule.h",
    "utils/dense_copy.h",
    "utils/file_loader.h",
    "utils/layer.h",
    "utils/parameter_names.h",
    "utils/reload_context.h",
    "utils/replace_parameter.h",
    "utils/safetensors_header.h",
    "utils/safetensors_writer.h",
    "utils/storage_fit.h",
    "utils/tensor_attrs.h",
    "utils/tensor_names.inc",
]
