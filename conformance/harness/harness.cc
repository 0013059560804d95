#include "conformance/harness/harness.h"

#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/tensor_attrs.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <sstream>

namespace reloadsafe::harness {
namespace {

struct TensorRecord {
  const void* data_ptr = nullptr;
  const c10::StorageImpl* storage = nullptr;
  const void* storage_ptr = nullptr;
  size_t storage_nbytes = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::kFloat;

  explicit TensorRecord(const at::Tensor& t)
      : storage(t.storage().unsafeGetStorageImpl()),
        storage_ptr(t.storage().data()),
        storage_nbytes(t.storage().nbytes()),
        sizes(t.sizes().vec()),
        strides(t.strides().vec()),
        offset(t.storage_offset()),
        dtype(t.scalar_type()) {
    if (storage_ptr != nullptr) {
      data_ptr =
          static_cast<const char*>(storage_ptr) + offset * static_cast<int64_t>(t.element_size());
    }
  }

  std::string layout() const {
    std::ostringstream os;
    os << c10::toString(dtype) << c10::IntArrayRef(sizes) << " stride " << c10::IntArrayRef(strides)
       << " offset " << offset;
    return os.str();
  }
};

std::string hex_ptr(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

using Records = std::vector<std::pair<std::string, TensorRecord>>;

// The checkpoint layouts of a freshly created layer: every parameter slot
// carrying a `_ckpt` record (a meta tensor with the checkpoint layout).
// Post-processing may replace those objects, so this is read once, up front.
Checkpoint checkpoint_layouts(const Layer& layer) {
  Checkpoint layouts;
  for (const auto& [name, param] : layer.parameter_slots()) {
    const AttrValue* record = param.defined() ? find_attr(param, "_ckpt") : nullptr;
    if (record != nullptr && std::holds_alternative<at::Tensor>(*record)) {
      layouts.emplace(name, std::get<at::Tensor>(*record));
    }
  }
  return layouts;
}

// A random checkpoint with the given layouts, on the CPU (where an mmap'd
// checkpoint lives).
Checkpoint draw_checkpoint(const Checkpoint& layouts, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Checkpoint ckpt;
  for (const auto& [name, meta] : layouts) {
    at::Tensor t;
    if (at::isFloatingType(meta.scalar_type())) {
      t = at::randn(meta.sizes(), gen, at::kFloat).to(meta.scalar_type());
    } else {
      t = at::randint(0, 100, meta.sizes(), gen, at::TensorOptions().dtype(meta.scalar_type()));
    }
    ckpt.emplace(name, t);
  }
  return ckpt;
}

void load(Layer& layer, const Checkpoint& ckpt) {
  for (const auto& [name, tensor] : ckpt) {
    at::Tensor param = layer.get(name);
    TORCH_CHECK(param.defined(), "checkpoint parameter '", name, "' is None after post-processing");
    const AttrValue* loader = find_attr(param, "weight_loader");
    TORCH_CHECK(loader != nullptr && std::holds_alternative<WeightLoader>(*loader) &&
                    std::get<WeightLoader>(*loader).fn,
                "checkpoint parameter '", name, "' lost its weight_loader");
    std::get<WeightLoader>(*loader).fn(param, tensor);
  }
}

Records records_of(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  Records records;
  for (const auto& [name, t] : tensors) records.emplace_back(name, TensorRecord(t));
  return records;
}

class ViolationSink {
 public:
  ViolationSink(ModeReport& report, int max_listed) : report_(report), max_listed_(max_listed) {}
  void add(int reload, std::string tensor, std::string what, std::string before,
           std::string after) {
    ++report_.violation_count;
    if (static_cast<int>(report_.violations.size()) < max_listed_) {
      report_.violations.push_back(
          {reload, std::move(tensor), std::move(what), std::move(before), std::move(after)});
    }
  }

 private:
  ModeReport& report_;
  int max_listed_;
};

void compare_records(const Records& before, const Records& after, int reload, ViolationSink& sink) {
  for (const auto& [name, b] : before) {
    auto it =
        std::find_if(after.begin(), after.end(), [&](const auto& r) { return r.first == name; });
    if (it == after.end()) {
      sink.add(reload, name, "missing", b.layout(), "(no longer kernel-visible)");
      continue;
    }
    const TensorRecord& a = it->second;
    if (a.data_ptr != b.data_ptr)
      sink.add(reload, name, "address", hex_ptr(b.data_ptr), hex_ptr(a.data_ptr));
    if (a.storage != b.storage)
      sink.add(reload, name, "storage", hex_ptr(b.storage), hex_ptr(a.storage));
    if (a.storage == b.storage &&
        (a.storage_ptr != b.storage_ptr || a.storage_nbytes != b.storage_nbytes)) {
      // The same storage object, reallocated or resized under the tensor.
      sink.add(reload, name, "storage resized or moved",
               hex_ptr(b.storage_ptr) + " " + std::to_string(b.storage_nbytes) + " B",
               hex_ptr(a.storage_ptr) + " " + std::to_string(a.storage_nbytes) + " B");
    }
    if (a.layout() != b.layout()) sink.add(reload, name, "layout", b.layout(), a.layout());
  }
  for (const auto& [name, a] : after) {
    auto it =
        std::find_if(before.begin(), before.end(), [&](const auto& r) { return r.first == name; });
    if (it == before.end())
      sink.add(reload, name, "new kernel-visible tensor", "(absent)", a.layout());
  }
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.cpu(), b.cpu());
}

ModeReport run_mode(const Backend& backend, ReloadMode mode, const RunOptions& options) {
  ModeReport report;
  report.mode = mode;
  const auto declared = backend.modes();
  report.expected_to_pass = std::find(declared.begin(), declared.end(), mode) != declared.end();
  ViolationSink sink(report, options.max_listed);
  try {
    ReloadSession session(backend, options.device, options.seed);
    const Records recorded = records_of(session.kernel_visible());
    at::Generator gen = at::detail::createCPUGenerator(options.seed + 7919);
    const at::Tensor x = at::randn(backend.input_shape(), gen, at::kFloat).to(options.device);
    const at::Tensor x_copy = x.clone();
    const at::Tensor canary =
        at::full({4096}, 0x5a, at::TensorOptions().dtype(at::kByte).device(options.device));

    for (int r = 1; r <= options.reloads; ++r) {
      const uint64_t seed = options.seed + 1000003ull * r;
      const Checkpoint ckpt = session.random_checkpoint(seed);
      Checkpoint pristine;
      for (const auto& [n, t] : ckpt) pristine.emplace(n, t.clone());
      session.reload(mode, ckpt);
      report.reloads_done = r;
      compare_records(recorded, records_of(session.kernel_visible()), r, sink);
      for (const auto& [n, t] : ckpt) {
        // The loaders and post-processing must not write into the checkpoint.
        if (!same_bytes(t, pristine.at(n))) sink.add(r, "checkpoint:" + n, "bytes changed", "", "");
      }
      if (!same_bytes(x, x_copy)) sink.add(r, "input", "bytes changed", "", "");
      if (!at::equal(canary.cpu(), at::full({4096}, 0x5a, at::kByte)))
        sink.add(r, "canary", "bytes changed", "", "");

      const at::Tensor out = backend.forward(session.layer(), x);
      const at::Tensor expected = session.cold_forward(ckpt, x);
      if (!at::allclose(out.cpu(), expected.cpu(), 1e-5, 1e-5)) {
        std::ostringstream b;
        b << "max |diff| " << (out.cpu() - expected.cpu()).abs().max().item<double>();
        sink.add(r, "forward", "differs from a cold load of the same checkpoint", "cold load",
                 b.str());
      }
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    report.error = what.substr(0, what.find('\n'));
  }
  return report;
}

}  // namespace

ReloadSession::ReloadSession(const Backend& backend, const c10::Device& device, uint64_t seed)
    : backend_(backend), device_(device) {
  layer_ = backend_.create_layer(device_);
  layouts_ = checkpoint_layouts(*layer_);
  TORCH_CHECK(!layouts_.empty(), "backend '", backend_.name(),
              "' created no checkpoint parameter (use make_checkpoint_param or set _ckpt)");
  load(*layer_, draw_checkpoint(layouts_, seed));
  backend_.process_weights_after_loading(*layer_);
}

Checkpoint ReloadSession::random_checkpoint(uint64_t seed) const {
  return draw_checkpoint(layouts_, seed);
}

void ReloadSession::reload(ReloadMode mode, const Checkpoint& ckpt) {
  DirectReloadScope direct(mode == ReloadMode::kDirect);
  load(*layer_, ckpt);
  backend_.process_weights_after_loading(*layer_);
}

std::vector<std::pair<std::string, at::Tensor>> ReloadSession::kernel_visible() const {
  auto tensors = kernel_parameters(*layer_);
  for (const auto& name : backend_.derived_names()) {
    at::Tensor t = layer_->get(name);
    if (t.defined()) tensors.emplace_back(name, t);
  }
  return tensors;
}

at::Tensor ReloadSession::cold_forward(const Checkpoint& ckpt, const at::Tensor& x) const {
  auto fresh = backend_.create_layer(device_);
  load(*fresh, ckpt);
  backend_.process_weights_after_loading(*fresh);
  return backend_.forward(*fresh, x);
}

bool BackendReport::ok() const {
  if (negative_control) {
    for (const auto& m : modes) {
      for (const auto& v : m.violations) {
        if (v.tensor == expected_violation) return true;
      }
    }
    return false;
  }
  for (const auto& m : modes) {
    if (m.expected_to_pass && !m.clean()) return false;
  }
  return true;
}

BackendReport run_backend(const Backend& backend, const RunOptions& options) {
  BackendReport report;
  report.name = backend.name();
  report.description = backend.description();
  report.negative_control = backend.negative_control();
  report.expected_violation = backend.expected_violation();
  for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
    report.modes.push_back(run_mode(backend, mode, options));
  }
  return report;
}

std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options) {
  nlohmann::ordered_json j;
  j["device"] = options.device.str();
  j["reloads"] = options.reloads;
  j["seed"] = options.seed;
  j["backends"] = nlohmann::ordered_json::array();
  for (const auto& r : reports) {
    nlohmann::ordered_json b;
    b["name"] = r.name;
    b["description"] = r.description;
    b["negative_control"] = r.negative_control;
    if (r.negative_control) b["expected_violation"] = r.expected_violation;
    b["ok"] = r.ok();
    for (const auto& m : r.modes) {
      nlohmann::ordered_json mj;
      mj["expected_to_pass"] = m.expected_to_pass;
      mj["reloads_done"] = m.reloads_done;
      mj["violation_count"] = m.violation_count;
      if (!m.error.empty()) mj["error"] = m.error;
      mj["violations"] = nlohmann::ordered_json::array();
      for (const auto& v : m.violations) {
        mj["violations"].push_back({{"reload", v.reload},
                                    {"tensor", v.tensor},
                                    {"what", v.what},
                                    {"before", v.before},
                                    {"after", v.after}});
      }
      b["modes"][to_string(m.mode)] = mj;
    }
    j["backends"].push_back(b);
  }
  return j.dump(2);
}

std::string to_table(const std::vector<BackendReport>& reports) {
  std::ostringstream os;
  auto cell = [](const ModeReport& m) {
    std::string s = !m.error.empty()         ? "error"
                    : m.violation_count == 0 ? "kept"
                                             : std::to_string(m.violation_count) + " violations";
    if (!m.expected_to_pass) s += " (not claimed)";
    return s;
  };
  os << std::left << std::setw(22) << "backend" << std::setw(28) << "normal reload" << std::setw(28)
     << "direct reload"
     << "verdict\n";
  for (const auto& r : reports) {
    std::string verdict = r.negative_control
                              ? (r.ok() ? "flagged (negative control)" : "NOT FLAGGED")
                              : (r.ok() ? "pass" : "FAIL");
    os << std::setw(22) << r.name << std::setw(28) << cell(r.modes[0]) << std::setw(28)
       << cell(r.modes[1]) << verdict << "\n";
  }
  for (const auto& r : reports) {
    for (const auto& m : r.modes) {
      if (!m.error.empty())
        os << "  " << r.name << " [" << to_string(m.mode) << "] error: " << m.error << "\n";
      for (const auto& v : m.violations) {
        if (&v - m.violations.data() >= 3) break;
        os << "  " << r.name << " [" << to_string(m.mode) << "] reload " << v.reload << ": "
           << v.tensor << " " << v.what << ": " << v.before << " -> " << v.after << "\n";
      }
    }
  }
  return os.str();
}

}  // namespace reloadsafe::harness
