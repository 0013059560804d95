// The load_from_file step: every reload writes its checkpoint to a
// safetensors file, then loads the file straight into the live layer's
// tensors of the same names with one FileLoader (utils/file_loader.h, its
// staging ring kept across reloads), in place of the layer's own load, and
// post-processes once, as an engine that reloads weights from a file does.
// Work a layer does in its loader rather than its post-processing (a derived
// tensor computed there) is skipped, and shows in the values.
//
// The file goes to a temporary folder of the step's own (made by the step,
// removed when it goes). Everything that would keep the load from running
// (a checkpoint name the layer has no tensor of, one of another dtype or
// shape, a tensor the loader cannot write whole) is found before the
// reload's load, so it is the mode's error (the layer's checkpoint layout
// is not its tensors'), not a verdict on the reload.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/harness/step.h"

#include "utils/file_loader.h"
#include "utils/safetensors_writer.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace reloadsafe::harness {
namespace {

// What the message of a refused layout ends with: the two ways to check
// such a layer.
constexpr const char* kUseTheLayersLoader =
    ": the layer's checkpoint layout differs from its tensors, so its checkpoint cannot be "
    "loaded into them by name. Check it through its own loader (run without load_from_file), or, "
    "from Python, pass load= a function that loads the file with reloadsafe.SafetensorsLoader "
    "and a name -> (tensor, byte offset) map";

std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " " << t.sizes();
  return out.str();
}

class LoadFromFileStep : public Step {
 public:
  // POSIX calls rather than std::filesystem: the Python extension shares
  // the process with LibTorch's own copy of its symbols.
  LoadFromFileStep() {
    const char* tmpdir = std::getenv("TMPDIR");
    const std::string tmp = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : P_tmpdir;
    std::string pattern = tmp + "/reloadsafe-load-from-file-XXXXXX";
    TORCH_CHECK(mkdtemp(pattern.data()) != nullptr, "load_from_file: cannot make a folder in ", tmp,
                " for the checkpoint's file: ", std::strerror(errno),
                "; set TMPDIR to a writable folder");
    dir_ = pattern;
    path_ = dir_ + "/checkpoint.safetensors";
  }

  // Destructors never throw: what cannot be removed is a warning.
  ~LoadFromFileStep() override {
    if (unlink(path_.c_str()) != 0 && errno != ENOENT) {
      TORCH_WARN("load_from_file: cannot remove ", path_, ": ", std::strerror(errno));
    }
    if (rmdir(dir_.c_str()) != 0) {
      TORCH_WARN("load_from_file: cannot remove ", dir_, ": ", std::strerror(errno));
    }
  }

  LoadFromFileStep(const LoadFromFileStep&) = delete;
  LoadFromFileStep& operator=(const LoadFromFileStep&) = delete;

  // The protocol loads through the first step that loads: two would leave
  // one unused, silently.
  void started(ModeContext& mode) override {
    TORCH_CHECK(
        !mode.options().steps.has("load_per_tensor") && !mode.info().steps.has("load_per_tensor"),
        "load_from_file and load_per_tensor both load in place of the layer's load; take "
        "one of them");
  }

  // The checkpoint's names matched with the live tensors and the file
  // written, outside the reload: what is refused here is the mode's error.
  void before_load(ModeContext& mode, const Reload& reload) override {
    std::map<std::string, at::Tensor> live;
    for (const NamedTensor& n : mode.live().named_tensors()) live.emplace(n.name, n.tensor);
    targets_.clear();
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, value] : reload.checkpoint) {
      const auto it = live.find(name);
      TORCH_CHECK(it != live.end(), "load_from_file: the checkpoint's tensor '", name, "' (",
                  describe(value), ") is no tensor of the layer", kUseTheLayersLoader);
      const at::Tensor& dst = it->second;
      TORCH_CHECK(
          dst.defined() && dst.scalar_type() == value.scalar_type() && dst.sizes() == value.sizes(),
          "load_from_file: the checkpoint's tensor '", name, "' is ", describe(value),
          ", the layer's '", name, "' is ",
          dst.defined() ? describe(dst) : std::string("undefined"), kUseTheLayersLoader);
      TORCH_CHECK(dst.layout() == at::kStrided && dst.is_contiguous(),
                  "load_from_file: the layer's '", name,
                  "' is not contiguous, and a file's tensor is loaded into a whole tensor's "
                  "bytes",
                  kUseTheLayersLoader);
      check_apart(name, dst);
      targets_[name] = LoadTarget{dst, std::nullopt};
      entries.push_back({name, value});
    }
    write_safetensors_file(path_, entries);
  }

  // Straight into the live tensors, at their addresses (FileLoader's
  // invariant); the protocol post-processes after it.
  bool load(ModeContext& /*mode*/, const Reload& /*reload*/) override {
    loader_.load_({path_}, targets_);
    targets_.clear();
    return true;
  }

  std::string circumstance() const override {
    return "loaded from a safetensors file into the layer's tensors";
  }

 private:
  // Two checkpoint names whose tensors share bytes (tied weights) would be
  // written twice; the loader refuses that, and so is it refused here.
  void check_apart(const std::string& name, const at::Tensor& dst) const {
    if (dst.numel() == 0) return;
    const auto* begin = static_cast<const char*>(dst.const_data_ptr());
    const auto* end = begin + dst.numel() * dst.element_size();
    for (const auto& [other, target] : targets_) {
      const at::Tensor& t = target.tensor;
      if (t.numel() == 0) continue;
      const auto* b = static_cast<const char*>(t.const_data_ptr());
      const auto* e = b + t.numel() * t.element_size();
      TORCH_CHECK(end <= b || e <= begin, "load_from_file: the layer's '", name, "' and '", other,
                  "' share memory (tied weights), and a file's tensor is loaded into memory no "
                  "other name writes",
                  kUseTheLayersLoader);
    }
  }

  std::string dir_;
  std::string path_;
  FileLoader loader_;
  LoadTargets targets_;  // this reload's, from before_load to load
};

}  // namespace

StepSpec load_from_file_step() {
  return StepSpec{
      "load_from_file",
      "--load-from-file",
      StepTakes::kSwitch,
      /*max_level=*/0,
      StepKind::kEngine,
      "Every reload writes its checkpoint to a safetensors file and loads it straight into the "
      "layer's tensors of the same names (FileLoader, in place of the layer's load), then "
      "post-processes, as an engine's reload from a file does.",
      "work the layer's loader does and its post-processing does not: `derived: differs from a "
      "cold load`",
      [](int64_t) -> std::unique_ptr<Step> { return std::make_unique<LoadFromFileStep>(); },
  };
}

}  // namespace reloadsafe::harness
