#define TORCH_ASSERT_ONLY_METHOD_OPERATORS

#include "conformance/trace/internal/op_names.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

namespace reloadsafe::trace {
namespace {

std::string_view interned(std::string name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>();  // never freed: views outlive exit
  std::lock_guard<std::mutex> lock(mutex);
  return *names->insert(std::move(name)).first;
}

}  // namespace

bool is_name_of(std::string_view full, std::string_view name, std::string_view overload) {
  if (overload.empty()) return full == name;
  return full.size() == name.size() + 1 + overload.size() &&
         full.compare(0, name.size(), name) == 0 && full[name.size()] == '.' &&
         full.compare(name.size() + 1, overload.size(), overload) == 0;
}

bool is_name_of(std::string_view full, const c10::FunctionSchema& schema) {
  return is_name_of(full, schema.name(), schema.overload_name());
}

// Note [Op names]
// A thread-local table of a few slots, indexed by the schema's address,
// finds a schema's interned name without a lock. A schema freed with its
// library can leave its address to another, so a hit is confirmed against
// the schema's name and overload (is_name_of) before it is used.
std::string_view op_name(const c10::FunctionSchema& schema) {
  struct Slot {
    const c10::FunctionSchema* schema = nullptr;
    std::string_view name;
  };
  thread_local std::array<Slot, 64> slots;
  Slot& slot = slots[(reinterpret_cast<uintptr_t>(&schema) >> 4) % slots.size()];
  if (slot.schema != &schema || !is_name_of(slot.name, schema)) {
    const std::string& overload = schema.overload_name();
    slot.schema = &schema;
    slot.name = interned(overload.empty() ? schema.name() : schema.name() + "." + overload);
  }
  return slot.name;
}

// As above, keyed by the address of the schema's name string (the name and
// overload a RecordFunction hands out are views of its schema's strings).
std::string_view op_name(const char* name, const char* overload) {
  struct Slot {
    const char* name = nullptr;
    const char* overload = nullptr;
    std::string_view full;
  };
  thread_local std::array<Slot, 64> slots;
  Slot& slot = slots[(reinterpret_cast<uintptr_t>(name) >> 4) % slots.size()];
  if (slot.name != name || slot.overload != overload || !is_name_of(slot.full, name, overload)) {
    slot.name = name;
    slot.overload = overload;
    std::string full(name);
    if (*overload != '\0') (full += '.') += overload;
    slot.full = interned(std::move(full));
  }
  return slot.full;
}

}  // namespace reloadsafe::trace
