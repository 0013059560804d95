#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "bench/machine_context.h"

#include "utils/copy_weight.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

namespace reloadsafe::bench {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

// The value after "key<spaces>:" on the first line of `path` that starts with
// one of `keys`, in the order the keys are given.
std::string proc_field(const std::string& path, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(key, 0) != 0) continue;
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      const auto first = value.find_first_not_of(" \t");
      return first == std::string::npos ? std::string() : value.substr(first);
    }
  }
  return {};
}

std::string cpu_model() {
  // x86 has "model name"; Arm kernels (GH200, GB10, Jetson) often only have
  // the implementer and part numbers.
  std::string model = proc_field("/proc/cpuinfo", {"model name", "Model", "cpu model"});
  if (!model.empty()) return model;
  const std::string implementer = proc_field("/proc/cpuinfo", {"CPU implementer"});
  const std::string part = proc_field("/proc/cpuinfo", {"CPU part"});
  if (!part.empty()) return "Arm implementer " + implementer + " part " + part;
  return "unknown (no model in /proc/cpuinfo)";
}

// The CPU's generation where the model name does not say it: virtual
// machines often show "AMD EPYC" for every generation, and the family and
// model numbers (25/1 is Milan, 25/17 Genoa) tell them apart. Empty where
// /proc/cpuinfo has no such fields (Arm: its part number is in cpu_model).
std::string cpu_id() {
  const std::string family = proc_field("/proc/cpuinfo", {"cpu family"});
  const std::string model = proc_field("/proc/cpuinfo", {"model\t"});
  if (family.empty() || model.empty()) return {};
  return "family " + family + " model " + model;
}

std::string kernel() {
  utsname u{};
  if (uname(&u) != 0) return "unknown (uname failed)";
  return std::string(u.sysname) + " " + u.release + " " + u.machine;
}

// Undoes the octal escapes (\040 for a space) of /proc/self/mountinfo.
std::string unescape_mount_path(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(s[i + 1]) && std::isdigit(s[i + 2]) &&
        std::isdigit(s[i + 3])) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string build_mode() {
#if defined(__OPTIMIZE__) && defined(NDEBUG)
  return "opt";
#elif defined(__OPTIMIZE__)
  return "optimized, assertions on (not -c opt)";
#else
  return "unoptimized (fastbuild or dbg): do not compare its timings";
#endif
}

std::string libtorch_version() {
#ifdef RELOADSAFE_LIBTORCH_VERSION
  return RELOADSAFE_LIBTORCH_VERSION;
#else
  return TORCH_VERSION;
#endif
}

// "570.86.15" from /proc/driver/nvidia/version, or "" (Tegra has no such
// file; its driver is part of the L4T release).
std::string nvidia_kernel_module_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return {};
  std::smatch m;
  static const std::regex kVersion(R"(\s(\d+\.\d+(\.\d+)?)\s)");
  return std::regex_search(line, m, kVersion) ? m[1].str() : std::string();
}

GpuInfo query_gpu() {
  GpuInfo info;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    info.reason = "none (libcuda.so.1 not found: no NVIDIA driver)";
    return info;
  }
  // The driver API's C signatures (cuda.h); CUdevice is an int, CUresult an
  // enum whose success value is 0.
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  using AttrFn = int (*)(int*, int, int);
  using VersionFn = int (*)(int*);
  using MemFn = int (*)(size_t*, int);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  auto attr = reinterpret_cast<AttrFn>(dlsym(lib, "cuDeviceGetAttribute"));
  auto version = reinterpret_cast<VersionFn>(dlsym(lib, "cuDriverGetVersion"));
  auto mem = reinterpret_cast<MemFn>(dlsym(lib, "cuDeviceTotalMem_v2"));
  if (!init || !count || !get || !name || !attr || !version) {
    info.reason = "unknown (libcuda.so.1 lacks the driver API entry points)";
    return info;
  }
  if (const int err = init(0); err != 0) {
    info.reason = "none (cuInit failed with CUresult " + std::to_string(err) + ")";
    return info;
  }
  if (count(&info.device_count) != 0 || info.device_count == 0) {
    info.reason = "none (the driver reports no CUDA device)";
    return info;
  }
  int device = 0;
  char buf[256] = {};
  int integrated = 0;
  if (get(&device, 0) != 0 || name(buf, sizeof(buf) - 1, device) != 0) {
    info.reason = "unknown (cuDeviceGetName failed)";
    return info;
  }
  constexpr int kCuDeviceAttributeIntegrated = 18;
  attr(&integrated, kCuDeviceAttributeIntegrated, device);
  int cuda = 0;
  version(&cuda);
  size_t bytes = 0;
  if (mem != nullptr && mem(&bytes, device) == 0) info.memory_gib = bytes / double(1 << 30);
  info.present = true;
  info.name = buf;
  info.integrated = integrated != 0;
  const std::string module = nvidia_kernel_module_version();
  std::ostringstream driver;
  driver << (module.empty() ? std::string("driver") : module) << " (CUDA " << cuda / 1000 << "."
         << (cuda % 1000) / 10 << ")";
  info.driver = driver.str();
  return info;
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

}  // namespace

std::string scratch_dir() {
  return env_or("RELOADSAFE_BENCH_DIR", env_or("TEST_TMPDIR", env_or("TMPDIR", "/tmp")));
}

std::string filesystem_of(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return "unknown (" + path + " does not exist)";
  const std::string target = resolved;
  std::ifstream in("/proc/self/mountinfo");
  std::string line, best_mount, best_type;
  while (std::getline(in, line)) {
    // id parent major:minor root mount-point options [optional...] - type source super-options
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount;
    fields >> id >> parent >> dev >> root >> mount;
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string type;
    tail >> type;
    mount = unescape_mount_path(mount);
    const bool under = target == mount || mount == "/" ||
                       (target.rfind(mount, 0) == 0 && target[mount.size()] == '/');
    // Later entries with the same mount point shadow earlier ones.
    if (under && mount.size() >= best_mount.size()) {
      best_mount = mount;
      best_type = type;
    }
  }
  if (best_type.empty()) return "unknown (" + target + " not in /proc/self/mountinfo)";
  return best_type + " (mounted at " + best_mount + ")";
}

const GpuInfo& gpu_info() {
  static const GpuInfo info = query_gpu();
  return info;
}

std::string machine_kind() {
  const std::string from_env = env_or("RELOADSAFE_BENCH_KIND", "");
  if (!from_env.empty()) return from_env;
  const GpuInfo& gpu = gpu_info();
  if (gpu.present) return slug(gpu.name);
  return "cpu-" + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + "core";
}

std::vector<ContextEntry> machine_context() {
  const GpuInfo& gpu = gpu_info();
  const std::string dir = scratch_dir();
  std::vector<ContextEntry> context = {
      {"machine_kind", machine_kind()},
      {"cpu_model", cpu_model()},
      {"cpu_id", cpu_id()},
      {"kernel", kernel()},
      {"scratch_dir", dir},
      {"scratch_fs", filesystem_of(dir)},
      {"page_size", std::to_string(page_size())},
      {"libtorch_version", libtorch_version()},
      {"torch_threads", std::to_string(at::get_num_threads())},
      {"omp_env", "OMP_NUM_THREADS=" + env_or("OMP_NUM_THREADS", "(unset)") +
                      " OMP_WAIT_POLICY=" + env_or("OMP_WAIT_POLICY", "(unset)")},
      {"reloadsafe_build", build_mode()},
      {"gpu", gpu.present ? gpu.name : gpu.reason},
  };
  if (gpu.present) {
    context.emplace_back("gpu_integrated", gpu.integrated ? "true" : "false");
    context.emplace_back("gpu_driver", gpu.driver);
    char mem[32];
    std::snprintf(mem, sizeof(mem), "%.1f", gpu.memory_gib);
    context.emplace_back("gpu_memory_gib", mem);
    context.emplace_back("gpu_count", std::to_string(gpu.device_count));
  }
  return context;
}

}  // namespace reloadsafe::bench
