#include "conformance/harness/protocol.h"

#include "conformance/harness/all_close.h"
#include "conformance/harness/capture.h"
#include "conformance/trace/memory_census.h"
#include "utils/reload_context.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

namespace reloadsafe::harness {
namespace {

using trace::to_hex;

// What the protocol records of a declared tensor. The layout is kept as
// its parts and written out only for a report (after every reload, for
// every declared tensor, a formatted string was most of the record's cost).
struct TensorRecord {
  const void* data_ptr = nullptr;
  const void* storage = nullptr;
  const void* storage_ptr = nullptr;
  size_t storage_nbytes = 0;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;

  explicit TensorRecord(const at::Tensor& t)
      : storage(t.storage().unsafeGetStorageImpl()),
        storage_ptr(t.storage().data()),
        storage_nbytes(t.storage().nbytes()),
        dtype(t.scalar_type()),
        sizes(t.sizes().vec()),
        strides(t.strides().vec()),
        storage_offset(t.storage_offset()) {
    if (storage_ptr != nullptr) {
      data_ptr = static_cast<const char*>(storage_ptr) +
                 t.storage_offset() * static_cast<int64_t>(t.element_size());
    }
  }
  bool same_layout(const TensorRecord& o) const {
    return dtype == o.dtype && sizes == o.sizes && strides == o.strides &&
           storage_offset == o.storage_offset;
  }
  std::string layout() const {
    std::ostringstream os;
    os << c10::toString(dtype) << c10::IntArrayRef(sizes) << " stride "
       << c10::IntArrayRef(strides) << " offset " << storage_offset;
    return os.str();
  }
};

using Records = std::vector<std::pair<std::string, TensorRecord>>;

Records declared_records(const std::vector<NamedTensor>& named) {
  Records records;
  for (const auto& n : named) {
    // A Python subclass tensor is recorded through its inner tensors, which
    // the subject names; its own storage is nothing a kernel reads.
    if (n.declared && n.tensor.defined() &&
        !n.tensor.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python) &&
        n.tensor.has_storage()) {
      records.emplace_back(n.name, TensorRecord(n.tensor));
    }
  }
  return records;
}

// Counts every violation and every flagged name; lists the first few.
class ViolationSink {
 public:
  ViolationSink(ModeReport& report, int max_listed) : report_(report), max_listed_(max_listed) {}

  void add(Violation v) {
    ++report_.violation_count;
    flag(v.tensor);
    flag(v.read);
    if (static_cast<int>(report_.violations.size()) < max_listed_) {
      report_.violations.push_back(std::move(v));
    }
  }
  void add(int reload, std::string tensor, std::string what, std::string before,
           std::string after) {
    add(Violation{reload, std::move(tensor), std::move(what), std::move(before), std::move(after),
                  ""});
  }

 private:
  void flag(const std::string& s) {
    if (s.empty()) return;
    if (std::find(report_.flagged.begin(), report_.flagged.end(), s) == report_.flagged.end()) {
      report_.flagged.push_back(s);
    }
  }
  ModeReport& report_;
  int max_listed_;
};

void compare_records(const Records& before, const Records& after, int reload, ViolationSink& sink) {
  auto find = [](const Records& rs, const std::string& name) {
    return std::find_if(rs.begin(), rs.end(), [&](const auto& r) { return r.first == name; });
  };
  for (const auto& [name, b] : before) {
    auto it = find(after, name);
    if (it == after.end()) {
      sink.add(reload, name, "missing", b.layout(), "(no longer declared)");
      continue;
    }
    const TensorRecord& a = it->second;
    if (a.data_ptr != b.data_ptr)
      sink.add(reload, name, "address", to_hex(b.data_ptr), to_hex(a.data_ptr));
    if (a.storage != b.storage)
      sink.add(reload, name, "storage", to_hex(b.storage), to_hex(a.storage));
    if (a.storage == b.storage &&
        (a.storage_ptr != b.storage_ptr || a.storage_nbytes != b.storage_nbytes)) {
      // The same storage object, reallocated or resized under the tensor.
      sink.add(reload, name, "storage resized or moved",
               to_hex(b.storage_ptr) + " " + std::to_string(b.storage_nbytes) + " B",
               to_hex(a.storage_ptr) + " " + std::to_string(a.storage_nbytes) + " B");
    }
    if (!a.same_layout(b)) sink.add(reload, name, "layout", b.layout(), a.layout());
  }
  for (const auto& [name, a] : after) {
    if (find(before, name) == before.end()) {
      sink.add(reload, name, "new declared tensor", "(absent)", a.layout());
    }
  }
}

// Whether t's bytes can be read in place as one run: a dense, contiguous CPU
// tensor with a storage that does not dispatch in Python.
bool plain_cpu_bytes(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided &&
         !t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python) && t.has_storage() &&
         t.is_contiguous();
}

// Byte for byte (NaN payloads included, which an element-wise == is not).
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (plain_cpu_bytes(a) && plain_cpu_bytes(b)) {
    const size_t n = a.numel() * a.element_size();  // no dispatch: the common case
    return n == 0 || std::memcmp(a.const_data_ptr(), b.const_data_ptr(), n) == 0;
  }
  if (a.layout() != at::kStrided || b.layout() != at::kStrided) return at::equal(a.cpu(), b.cpu());
  const at::Tensor ca = a.cpu().contiguous();
  const at::Tensor cb = b.cpu().contiguous();
  const size_t n = ca.numel() * ca.element_size();
  return n == 0 || std::memcmp(ca.const_data_ptr(), cb.const_data_ptr(), n) == 0;
}

// A tensor's bytes as they are now, to tell later whether anything wrote
// into it: for a dense CPU tensor a plain copy of its bytes (no tensor op,
// nothing the census counts), else a clone.
class Snapshot {
 public:
  explicit Snapshot(const at::Tensor& t) {
    if (plain_cpu_bytes(t)) {
      const auto* p = static_cast<const unsigned char*>(t.const_data_ptr());
      bytes_.assign(p, p + t.numel() * t.element_size());
      bytes_taken_ = true;
    } else {
      clone_ = t.clone();
    }
  }
  bool unchanged(const at::Tensor& t) const {
    if (!bytes_taken_) return same_bytes(t, clone_);
    if (!plain_cpu_bytes(t) || static_cast<size_t>(t.numel() * t.element_size()) != bytes_.size()) {
      return false;
    }
    return bytes_.empty() || std::memcmp(t.const_data_ptr(), bytes_.data(), bytes_.size()) == 0;
  }

 private:
  bool bytes_taken_ = false;
  std::vector<unsigned char> bytes_;
  at::Tensor clone_;
};

std::string max_diff(const at::Tensor& a, const at::Tensor& b) {
  std::ostringstream os;
  if (a.sizes() != b.sizes()) {
    os << "shape " << a.sizes() << " vs " << b.sizes();
  } else {
    os << "max |diff| "
       << (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>();
  }
  return os.str();
}

// NaN and infinities at the same places in both compare equal: a layer may
// legitimately compute them, and a stale read of poisoned memory (see Note
// [Poison quarantine] in memory_census.h) still differs from a fresh load.
bool close(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  // Dense float outputs in one pass (all_close.h); anything else through allclose.
  if (std::optional<bool> fast = all_close(a, b, 1e-5, 1e-5)) return *fast;
  if (a.scalar_type() == b.scalar_type() && a.device() == b.device()) {
    return at::allclose(a, b, 1e-5, 1e-5, /*equal_nan=*/true);
  }
  return at::allclose(a.cpu().to(at::kDouble), b.cpu().to(at::kDouble), 1e-5, 1e-5,
                      /*equal_nan=*/true);
}

// Note [One cold load per checkpoint]
// Each reload's outputs are compared with the forward of a fresh cold load
// of the same checkpoint. Both modes reload the same checkpoints (the seeds
// depend on the reload's number only) into the same input, so the second
// mode's cold loads would recompute the first's: a new layer, a load, a
// post-processing and a forward per reload, as much as the reload itself.
// On the CPU each cold-load output is kept (a copy of its bytes) for the
// mode after, with a fingerprint of what it was computed from (every
// checkpoint tensor's name, dtype, sizes and bytes, and the input's), and
// reused only when the later checkpoint and input have the same fingerprint;
// a subject whose checkpoints or inputs differ for the same seed gets its
// own cold loads as before. A cold load that depends on anything but the
// checkpoint (a random rotation drawn at load) fails the comparison within
// the first mode already. The kept copies are the protocol's, not the
// subject's: the memory census of the mode that makes them does not count
// them.
class ColdLoadOutputs {
 public:
  explicit ColdLoadOutputs(bool keep) : keep_(keep) {}

  // The cold-load forward for reload `r` of `ckpt` on `x`: a kept one with
  // the same fingerprint, else `cold_forward()` (kept for the next mode if
  // reload `r` has none kept yet).
  template <typename ColdForward>
  at::Tensor forward(int r, const Checkpoint& ckpt, const at::Tensor& x,
                     const ColdForward& cold_forward) {
    uint64_t print = 0;
    const bool printed = keep_ && fingerprint(ckpt, x, &print);
    if (printed) {
      auto it = kept_.find(r);
      if (it != kept_.end() && it->second.fingerprint == print) return it->second.output;
    }
    at::Tensor out = cold_forward();
    if (printed && kept_.count(r) == 0 && out.defined() && out.device().is_cpu() &&
        out.layout() == at::kStrided) {
      at::Tensor copy = out.clone(at::MemoryFormat::Contiguous);
      kept_bytes_ += static_cast<int64_t>(copy.storage().nbytes());
      kept_[r] = Kept{print, std::move(copy)};
    }
    return out;
  }

  // Bytes of the copies kept so far (the census discounts those made in its mode).
  int64_t kept_bytes() const { return kept_bytes_; }

 private:
  static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDull;
  }
  // One pass over the bytes, eight at a time (FNV-style, 64 bits).
  static uint64_t mix_bytes(uint64_t h, const at::Tensor& t) {
    const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
    const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001B3ull;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
    return mix(h, n);
  }
  // Mixes t's dtype, sizes and bytes into *h; false for a tensor whose bytes
  // are not simply there to read (not a dense CPU tensor, a Python subclass).
  static bool mix_tensor(uint64_t* h, const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || !t.has_storage() ||
        t.is_conj() || t.is_neg() ||
        t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) {
      return false;
    }
    *h = mix(*h, static_cast<uint64_t>(t.scalar_type()));
    for (int64_t d : t.sizes()) *h = mix(*h, static_cast<uint64_t>(d));
    *h = mix_bytes(*h, t);
    return true;
  }
  static bool fingerprint(const Checkpoint& ckpt, const at::Tensor& x, uint64_t* out) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (const auto& [name, t] : ckpt) {
      for (char c : name) h = mix(h, static_cast<unsigned char>(c));
      if (!mix_tensor(&h, t)) return false;
    }
    if (!mix_tensor(&h, x)) return false;
    *out = h;
    return true;
  }

  struct Kept {
    uint64_t fingerprint;
    at::Tensor output;
  };
  bool keep_;
  std::map<int, Kept> kept_;
  int64_t kept_bytes_ = 0;
};

// The captured forward and what it reads, named and checked once.
struct Capture {
  std::unique_ptr<CapturedForward> forward;
  std::unique_ptr<TensorNames> names;
};

Capture capture_forward(ReloadSubject& subject, const at::Tensor& x, ModeReport& report) {
  Capture c;
  c.names = std::make_unique<TensorNames>(subject.named_tensors());
  for (const NamedObject& o : subject.named_objects()) c.names->add_object(o.name, o.identity);
  c.names->add("input", x, /*declared=*/true);
  c.forward = std::make_unique<CapturedForward>([&] { return subject.forward(x); });
  std::set<const void*> declared, undeclared;
  for (const CapturedRead& r : c.forward->reads(*c.names)) {
    if (r.name == "input") continue;
    // A subclass wrapper is checked through its inner reads; a tensor without
    // storage has nothing addressable.
    if (r.kind == CapturedRead::Kind::kSubclass || r.kind == CapturedRead::Kind::kNoStorage)
      continue;
    if (r.declared) {
      declared.insert(r.storage);
    } else if (undeclared.insert(r.storage).second) {
      report.warnings.push_back(Warning{
          r.name, r.op,
          "read but not declared (" + r.layout +
              "); checked like a declared tensor; declare it if the forward is meant to read it"});
    }
  }
  report.declared_reads = static_cast<int>(declared.size());
  report.undeclared_reads = static_cast<int>(undeclared.size());
  const size_t ops = c.forward->trace().ops().size();
  TORCH_CHECK(ops > 0,
              "the forward ran no operator on the calling thread: if it runs its ops on another "
              "thread (a thread pool, an executor, a background stream), the read trace cannot "
              "see them (it records the calling thread only); run the forward's ops on the "
              "thread that calls it while checking");
  TORCH_CHECK(!declared.empty() || !undeclared.empty(), "the forward reads no tensor besides its input (",
              ops,
              " ops traced): it must read the layer's weights through dispatcher ops; a kernel "
              "launched without the dispatcher, or ops run on another thread, are invisible to "
              "the trace");
  return c;
}

ModeReport run_mode(ReloadSubject& subject, ReloadMode mode, const RunOptions& options,
                    ColdLoadOutputs& cold_loads) {
  ModeReport report;
  report.mode = mode;
  const auto declared = subject.modes();
  report.expected_to_pass = std::find(declared.begin(), declared.end(), mode) != declared.end();
  ViolationSink sink(report, options.max_listed);
  // The census counts live CPU bytes while the check runs; storages a reload
  // frees are poisoned and held (see Note [Poison quarantine]). Both end with
  // the mode, leaving the process's allocator as it was.
  std::optional<trace::CpuCensusScope> census;
  std::optional<trace::Quarantine> quarantine;
  if (options.device.is_cpu()) {
    census.emplace();
    quarantine.emplace();
  }
  try {
    subject.cold_load(subject.make_checkpoint(options.seed));
    const at::Tensor x = subject.make_input(options.seed + 7919).to(options.device);
    const at::Tensor x_copy = x.clone();
    const at::Tensor canary =
        at::full({4096}, 0x5a, at::TensorOptions().dtype(at::kByte).device(options.device));
    const at::Tensor canary_bytes = at::full({4096}, 0x5a, at::kByte);  // what it must still hold

    // Engines run the forward before they capture; state it makes and keeps
    // (a workspace, a first-forward repack) belongs to the capture, so the
    // baseline of declared tensors is taken after it too.
    subject.forward(x);
    const Records recorded = declared_records(subject.named_tensors());
    Capture capture;
    if (options.trace) capture = capture_forward(subject, x, report);
    // Cold-load outputs kept for the next mode are not the subject's (Note
    // [One cold load per checkpoint]).
    const int64_t kept_before = cold_loads.kept_bytes();
    auto memory = [&] {
      if (auto bytes = trace::live_tensor_bytes(options.device))
        report.memory_bytes.push_back(*bytes - (cold_loads.kept_bytes() - kept_before));
    };
    memory();

    for (int r = 1; r <= options.reloads; ++r) {
      const uint64_t seed = options.seed + 1000003ull * static_cast<uint64_t>(r);
      const Checkpoint ckpt = subject.make_checkpoint(seed);
      std::map<std::string, Snapshot> pristine;
      for (const auto& [n, t] : ckpt) pristine.emplace(n, Snapshot(t));
      {
        DirectReloadScope direct(mode == ReloadMode::kDirect);
        std::optional<trace::Quarantine::Capturing> capturing;
        if (quarantine) capturing.emplace(*quarantine);
        subject.reload(ckpt, mode);
      }
      report.reloads_done = r;
      memory();
      compare_records(recorded, declared_records(subject.named_tensors()), r, sink);
      for (const auto& [n, t] : ckpt) {
        // The loaders and post-processing must not write into the checkpoint.
        if (!pristine.at(n).unchanged(t)) sink.add(r, "checkpoint:" + n, "bytes changed", "", "");
      }
      if (!same_bytes(x, x_copy)) sink.add(r, "input", "bytes changed", "", "");
      if (!same_bytes(canary, canary_bytes)) sink.add(r, "canary", "bytes changed", "", "");

      at::Tensor out;
      if (options.trace) {
        trace::ReadTrace retrace;
        out = subject.forward(x);
        retrace.stop();
        for (Violation& v : capture.forward->compare(retrace, *capture.names, r))
          sink.add(std::move(v));
      } else {
        out = subject.forward(x);
      }
      const at::Tensor expected =
          cold_loads.forward(r, ckpt, x, [&] { return subject.fresh_forward(ckpt, x); });
      if (!close(out, expected)) {
        sink.add(r, "forward", "differs from a cold load of the same checkpoint", "cold load",
                 max_diff(out, expected));
      }
      if (options.trace) {
        std::string why;
        std::optional<at::Tensor> replayed = capture.forward->replay(&why);
        if (!replayed) {
          if (r == 1) report.warnings.push_back(Warning{"replay", "", "not replayed: " + why});
        } else if (!close(*replayed, expected)) {
          sink.add(r, "replay",
                   "the captured ops, replayed, differ from a cold load (a stale read)",
                   "cold load", max_diff(*replayed, expected));
        }
      }
    }
    if (report.memory_bytes.size() >= 3) {
      // Growth after the first reload: the cold load and the first reload may
      // legitimately allocate (a storage released by the first
      // post-processing is re-made by the first load).
      const int64_t first = report.memory_bytes[1];
      const int64_t last = report.memory_bytes.back();
      if (last - first > subject.memory_tolerance_bytes()) {
        sink.add(Violation{
            options.reloads, "memory",
            "grew by " + std::to_string(last - first) + " bytes over " +
                std::to_string(options.reloads - 1) + " reloads",
            std::to_string(first) + " B after reload 1",
            std::to_string(last) + " B after reload " + std::to_string(options.reloads), ""});
      }
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    report.error = what.substr(0, what.find('\n'));
  }
  try {
    subject.release();
  } catch (const std::exception&) {
  }
  return report;
}

bool matches(const std::string& expected, const std::string& flagged) {
  if (expected.empty()) return false;
  if (flagged == expected) return true;
  // "aten::div" matches "aten::div.Tensor arg 1 (other)"; "scale" matches
  // "scale (undeclared)".
  return flagged.rfind(expected, 0) == 0 && flagged.size() > expected.size() &&
         (flagged[expected.size()] == ' ' || flagged[expected.size()] == '.');
}

}  // namespace

bool BackendReport::ok() const {
  if (negative_control) {
    for (const auto& m : modes) {
      for (const auto& f : m.flagged) {
        if (matches(expected_violation, f)) return true;
      }
    }
    return false;
  }
  for (const auto& m : modes) {
    if (m.expected_to_pass && !m.clean()) return false;
  }
  return true;
}

BackendReport run_subject(ReloadSubject& subject, const RunOptions& options) {
  BackendReport report;
  report.name = subject.name();
  report.description = subject.description();
  report.negative_control = subject.negative_control();
  report.expected_violation = subject.expected_violation();
  ColdLoadOutputs cold_loads(/*keep=*/options.device.is_cpu());
  for (ReloadMode mode : {ReloadMode::kNormal, ReloadMode::kDirect}) {
    report.modes.push_back(run_mode(subject, mode, options, cold_loads));
  }
  return report;
}

std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options) {
  nlohmann::ordered_json j;
  j["device"] = options.device.str();
  j["reloads"] = options.reloads;
  j["seed"] = options.seed;
  j["trace"] = options.trace;
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
      mj["declared_reads"] = m.declared_reads;
      mj["undeclared_reads"] = m.undeclared_reads;
      if (!m.error.empty()) mj["error"] = m.error;
      mj["flagged"] = m.flagged;
      mj["violations"] = nlohmann::ordered_json::array();
      for (const auto& v : m.violations) {
        nlohmann::ordered_json vj{{"reload", v.reload},
                                  {"tensor", v.tensor},
                                  {"what", v.what},
                                  {"before", v.before},
                                  {"after", v.after}};
        if (!v.read.empty()) vj["read"] = v.read;
        mj["violations"].push_back(vj);
      }
      mj["warnings"] = nlohmann::ordered_json::array();
      for (const auto& w : m.warnings) {
        mj["warnings"].push_back({{"tensor", w.tensor}, {"read", w.read}, {"message", w.message}});
      }
      mj["memory_bytes"] = m.memory_bytes;
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
    if (!m.warnings.empty()) s += ", " + std::to_string(m.warnings.size()) + " warn";
    if (!m.expected_to_pass) s += " (not claimed)";
    return s;
  };
  auto reads = [](const BackendReport& r) {
    if (r.modes.empty()) return std::string("-");
    return std::to_string(r.modes[0].declared_reads) + "/" +
           std::to_string(r.modes[0].undeclared_reads);
  };
  size_t name_width = 24;  // at least two spaces after the longest name
  for (const auto& r : reports) name_width = std::max(name_width, r.name.size() + 2);
  const int w = static_cast<int>(name_width);
  os << std::left << std::setw(w) << "backend" << std::setw(30) << "normal reload" << std::setw(30)
     << "direct reload" << std::setw(12) << "reads d/u"
     << "verdict\n";
  for (const auto& r : reports) {
    const std::string verdict = r.negative_control
                                    ? (r.ok() ? "flagged (negative control)" : "NOT FLAGGED")
                                    : (r.ok() ? "pass" : "FAIL");
    os << std::setw(w) << r.name << std::setw(30) << (r.modes.size() > 0 ? cell(r.modes[0]) : "")
       << std::setw(30) << (r.modes.size() > 1 ? cell(r.modes[1]) : "") << std::setw(12) << reads(r)
       << verdict << "\n";
  }
  for (const auto& r : reports) {
    for (const auto& m : r.modes) {
      const std::string tag = "  " + r.name + " [" + to_string(m.mode) + "] ";
      if (!m.error.empty()) os << tag << "error: " << m.error << "\n";
      for (size_t i = 0; i < m.violations.size() && i < 3; ++i) {
        const Violation& v = m.violations[i];
        os << tag << "reload " << v.reload << ": ";
        if (!v.read.empty()) os << v.read << " ";
        os << (v.read.empty() ? v.tensor : "(" + v.tensor + ")") << " " << v.what << ": "
           << v.before << " -> " << v.after << "\n";
      }
      for (size_t i = 0; i < m.warnings.size() && i < 3; ++i) {
        const Warning& w = m.warnings[i];
        os << tag << "warning: " << (w.read.empty() ? "" : w.read + " ") << "(" << w.tensor << ") "
           << w.message << "\n";
      }
    }
  }
  return os.str();
}

}  // namespace reloadsafe::harness
