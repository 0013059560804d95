// protocol.h: the reload protocol, over any layer under test.
//
// What a captured CUDA graph needs from a reload: every tensor its kernels
// read is at the address, on the storage and in the layout it had at
// capture, and holds the new weights. The protocol checks exactly that, for
// any ReloadSubject (a C++ Backend through its adapter in harness.h, or a
// Python layer through the Python module), once per reload mode:
//
//   1. cold load; one warm-up forward (engines warm up before they capture);
//      then the forward traced once with a ReadTrace: the captured read set,
//      in op order, with every tensor argument held as the capture held it
//      (see capture.h);
//   2. many reloads (the direct mode inside a DirectReloadScope) of
//      value-changing checkpoints;
//   3. after each reload:
//      - every declared tensor kept its name, address, storage, storage size
//        and layout; none appeared or vanished;
//      - the forward traced again issues the captured op sequence, and every
//        external read is at the captured data pointer, on the captured
//        storage, with the captured layout (whether declared or not);
//      - the captured ops replayed against the held tensors give the forward
//        of a fresh cold load of the same checkpoint (a stale read shows as
//        wrong output, as on a GPU);
//      - the live forward equals that fresh forward;
//      - checkpoint tensors, the input and a canary are byte-for-byte
//        unchanged;
//   4. the bytes held in live tensor storages do not grow after the first
//      reload (beyond the subject's tolerance).
//
// Every broken promise is a Violation naming the tensor (and, for a traced
// read, the op and argument), with before and after. External reads the
// subject did not declare but that stay put are warnings.
#pragma once

#include "conformance/harness/backend.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::harness {

/// One broken promise after one reload.
struct Violation {
  int reload = 0;  ///< 1-based reload number
  /// The tensor's name: a runtime or derived name, "checkpoint:<name>",
  /// "input", "canary", "forward", "replay", "memory", "op sequence", or for
  /// a traced read the name its storage has ("undeclared tensor" if none).
  std::string tensor;
  std::string what;  ///< "address", "storage", "layout", "missing", "grew", ...
  std::string before;
  std::string after;
  /// For a traced read: "aten::div.Tensor arg 1 (other)"; empty otherwise.
  std::string read;
};

/// A remark that is not a violation (an undeclared read that stays put, an
/// op the CPU replay cannot run).
struct Warning {
  std::string tensor;
  std::string read;
  std::string message;
};

struct RunOptions {
  int reloads = 20;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 1;
  /// Stop listing violations after this many per mode (all are counted).
  int max_listed = 20;
  /// Trace the forward (capture emulation, CPU replay). Off: only declared
  /// tensors, values and memory are checked.
  bool trace = true;
};

/// One read of the captured forward, for reports.
struct CapturedRead {
  std::string op;    ///< "aten::mm arg 1 (mat2)"
  int depth = 0;     ///< 0: an op the forward called; n: nested inside one
  std::string name;  ///< the tensor's name, "input" or "undeclared tensor"
  bool declared = false;
  std::string layout;  ///< for an object: its class
  const void* storage = nullptr;  ///< identity, for counting distinct tensors
  enum class Kind {
    kTensor,     ///< a tensor with a storage: checked for address and layout
    kSubclass,   ///< a Python subclass tensor: its inner reads are checked
    kNoStorage,  ///< sparse, mkldnn, nested: nothing addressable to check
    kObject,     ///< an opaque object: checked for identity
  };
  Kind kind = Kind::kTensor;
};

struct ModeReport {
  ReloadMode mode = ReloadMode::kNormal;
  bool expected_to_pass = true;  ///< the subject declares this mode
  int reloads_done = 0;
  int64_t violation_count = 0;
  /// Every distinct tensor (Violation::tensor) and read (Violation::read)
  /// flagged, whether or not listed (listing stops at max_listed).
  std::vector<std::string> flagged;
  std::vector<Violation> violations;
  std::vector<Warning> warnings;
  /// Distinct tensors (storages) the captured forward reads from outside,
  /// the input excluded: declared ones and undeclared ones.
  int declared_reads = 0;
  int undeclared_reads = 0;
  /// Bytes in live CPU tensor storages (or CUDA allocated bytes) after the
  /// cold load and after each reload; empty where not measured.
  std::vector<int64_t> memory_bytes;
  std::string error;  ///< an exception from the subject or the protocol
  bool clean() const { return error.empty() && violation_count == 0; }
};

struct BackendReport {
  std::string name;
  std::string description;
  bool negative_control = false;
  std::string expected_violation;
  std::vector<ModeReport> modes;

  /// A sample passes when every mode it declares is clean; a negative
  /// control passes (is detected) when some mode flags the tensor or read it
  /// names (matched against every violation, listed or not).
  bool ok() const;
};

/// A tensor the subject can name. Declared tensors are the subject's
/// promise: the forward may read them and they keep address, storage and
/// layout across reloads. Undeclared ones only name traced reads.
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  bool declared = true;
};

/// An opaque object (a TorchBind script object) the subject can name, by
/// identity (trace::ObjectRead::identity).
struct NamedObject {
  std::string name;
  const void* identity = nullptr;
};

/// What the protocol needs from a layer under test, whatever it is written
/// in. The subject holds one live layer at a time.
class ReloadSubject {
 public:
  virtual ~ReloadSubject() = default;

  virtual std::string name() const = 0;
  virtual std::string description() const { return ""; }

  /// A checkpoint drawn from `seed`: the same names and layouts for every
  /// seed, different values (on the CPU, where an mmap'd checkpoint lives).
  virtual Checkpoint make_checkpoint(uint64_t seed) = 0;

  /// Creates the live layer, loads `ckpt` through its loaders and
  /// post-processes it.
  virtual void cold_load(const Checkpoint& ckpt) = 0;

  /// Loads `ckpt` into the live layer through the same loaders and
  /// post-processes again. The protocol has already entered a
  /// DirectReloadScope for the direct mode.
  virtual void reload(const Checkpoint& ckpt, ReloadMode mode) = 0;

  /// The live layer's forward.
  virtual at::Tensor forward(const at::Tensor& x) = 0;

  /// The forward on `x` of a fresh cold load of `ckpt` (a second layer).
  virtual at::Tensor fresh_forward(const Checkpoint& ckpt, const at::Tensor& x) = 0;

  /// Every tensor of the live layer the subject can name.
  virtual std::vector<NamedTensor> named_tensors() = 0;

  /// Every opaque object of the live layer the subject can name.
  virtual std::vector<NamedObject> named_objects() { return {}; }

  /// The forward's input, drawn from `seed`.
  virtual at::Tensor make_input(uint64_t seed) = 0;

  /// Drops the live layer (between modes).
  virtual void release() {}

  /// The modes in which the subject claims to keep every address.
  virtual std::vector<ReloadMode> modes() const {
    return {ReloadMode::kNormal, ReloadMode::kDirect};
  }
  virtual bool negative_control() const { return false; }
  /// For a negative control: the tensor name, or the start of the read
  /// ("aten::div"), that must be flagged.
  virtual std::string expected_violation() const { return ""; }
  /// Bytes live storages may grow by after the first reload.
  virtual int64_t memory_tolerance_bytes() const { return 0; }
};

/// Runs the protocol for `subject` in both modes.
BackendReport run_subject(ReloadSubject& subject, const RunOptions& options);

/// The reports as JSON (for machines); the schema is the same for C++ and
/// Python subjects.
std::string to_json(const std::vector<BackendReport>& reports, const RunOptions& options);

/// The reports as a table with a verdict per backend (for people).
std::string to_table(const std::vector<BackendReport>& reports);

}  // namespace reloadsafe::harness
