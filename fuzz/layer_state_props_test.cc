// Stateful property (rc::state) of a layer going through post-processing and
// reloads: random sequences of replace_parameter, set_kernel_parameter,
// move_parameter, retire_parameter, refill_derived and whole reloads (new
// values copied into every registered parameter through its data, then
// post-processing under a direct reload), checked after every command against
// a model of
//  - what each name holds (which object, by model id, or None or nothing),
//    and the registration order;
//  - each object's layout, attributes (retired, runtime_name, is_shuffled),
//    whether it is live, and the storage it lives on (by model id, with the
//    data pointer that storage had when it was made);
//  - every byte of every storage the test made (so writes land exactly where
//    the rules say and nowhere else);
//  - kernel_parameters and get_live_param.
// The property is also run with a flaw in the model and in the system, which
// it must catch.
#include "fuzz/expect_failure.h"
#include "fuzz/generators.h"
#include "fuzz/spec_model.h"
#include "utils/copy_weight.h"
#include "utils/layer.h"
#include "utils/parameter_names.h"
#include "utils/reload_context.h"
#include "utils/replace_parameter.h"
#include "utils/tensor_attrs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace reloadsafe::fuzz {
namespace {

const std::vector<std::string>& param_names() {
  static const std::vector<std::string> names = {"w", "w_ckpt", "scale"};
  return names;
}
const std::vector<std::string>& derived_names() {
  static const std::vector<std::string> names = {"d"};
  return names;
}

/// Deliberate mistakes, for the tests that show the property can fail.
enum class Flaw {
  kNone,
  kModelIgnoresRuntimeName,  // the model lists moved objects under their first name
  kSutReloadsWithoutDirect,  // the system post-processes reloads outside a direct reload
};

// ---------------------------------------------------------------------------
// Tensors the commands bring

/// A new tensor: a layout on a storage of its own, random contents.
struct NewTensor {
  Layout layout;
  int64_t slack = 0;
  uint64_t seed = 0;
  int shuffled = -1;  // attribute is_shuffled: -1 absent, 0 False, 1 True

  int64_t storage_nbytes() const { return layout.end_bytes() + slack; }
};

std::ostream& operator<<(std::ostream& os, const NewTensor& t) {
  os << t.layout;
  if (t.slack) os << " slack " << t.slack;
  if (t.shuffled >= 0) os << " is_shuffled=" << t.shuffled;
  return os;
}

/// Random bytes; the bytes of bool elements of `l` (at `byte_offset`) are 0 or 1.
std::vector<uint8_t> random_bytes(int64_t n, uint64_t seed, int64_t byte_offset = 0,
                                  const Layout* l = nullptr) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  if (l != nullptr && l->dtype == at::kBool) {
    for (int64_t off : model::element_offsets(l->shape, l->stride)) out[byte_offset + off] &= 1;
  }
  return out;
}

std::vector<uint8_t> initial_bytes(const NewTensor& t) {
  return random_bytes(t.storage_nbytes(), t.seed, t.layout.offset * t.layout.itemsize(), &t.layout);
}

/// The layouts commands use: no expanded or self-overlapping ones (writes
/// into them would not be exact; the other properties cover them), rank <= 3.
LayoutOptions state_layouts() {
  LayoutOptions o;
  o.expanded = false;
  o.overlapping = false;
  o.max_rank = 3;
  return o;
}

/// A new tensor for `name`, often related to what `name` holds now (same
/// layout, a repack to the same bytes, a grown one) so that every branch of
/// replace_parameter is reached.
rc::Gen<NewTensor> gen_new_tensor(std::optional<Layout> current) {
  return rc::gen::exec([current] {
    NewTensor t;
    const LayoutOptions opts = state_layouts();
    const int relation =
        current ? *rc::gen::weightedElement<int>({{3, 0}, {2, 1}, {2, 2}, {1, 3}}) : 0;
    if (relation == 1) {  // old's exact layout: in place
      t.layout = *current;
    } else if (relation == 2 || relation == 3) {  // a repack, the same size or grown
      const auto dtype = *rc::gen::elementOf(opts.dtypes);
      const int64_t bytes = current->numel() * current->itemsize() * (relation == 3 ? 2 : 1);
      t.layout = *gen_layout_of({bytes / itemsize(dtype)}, dtype, opts);
    } else {
      t.layout = *gen_layout(opts);
    }
    t.layout.offset = *rc::gen::inRange<int64_t>(0, 3);
    t.slack = *rc::gen::weightedElement<int64_t>({{3, 0}, {1, 6}});
    t.seed = *rc::gen::arbitrary<uint64_t>();
    t.shuffled = *rc::gen::weightedElement<int>({{4, -1}, {1, 0}, {1, 1}});
    return t;
  });
}

// ---------------------------------------------------------------------------
// The model

struct ObjectModel {
  Layout layout;  // offset: in elements of layout.dtype, in its storage
  int sid = -1;
  bool parameter = true;
  bool retired = false;
  std::string runtime_name;  // empty: none
  int shuffled = -1;
};

struct Model {
  std::vector<std::string> order;      // parameter names, in registration order
  std::map<std::string, int> slots;    // parameter name -> object id, -1 for None
  std::map<std::string, int> derived;  // derived name -> object id, -1 for None
  std::map<int, ObjectModel> objects;
  std::map<int, std::vector<uint8_t>> storages;  // every storage's bytes
  int next_oid = 0;
  int next_sid = 0;
  Flaw flaw = Flaw::kNone;
  // How often each branch was taken, for the case's classification only.
  std::map<std::string, int> events;

  /// The object `name` holds (parameter or derived), or -1.
  int held(const std::string& name) const {
    for (const auto* table : {&slots, &derived}) {
      auto it = table->find(name);
      if (it != table->end()) return it->second;
    }
    return -1;
  }
  std::optional<Layout> held_layout(const std::string& name) const {
    const int oid = held(name);
    return oid < 0 ? std::nullopt : std::optional<Layout>(objects.at(oid).layout);
  }
  int64_t byte_offset(const ObjectModel& o) const { return o.layout.offset * o.layout.itemsize(); }

  int add_storage(std::vector<uint8_t> bytes) {
    storages[next_sid] = std::move(bytes);
    return next_sid++;
  }
  /// The bytes of every element of layout `l` on storage `sid` at `byte_off`.
  std::vector<uint8_t> read(int sid, int64_t byte_off, const Layout& l) const {
    const std::vector<uint8_t>& s = storages.at(sid);
    std::vector<uint8_t> out;
    for (int64_t off : model::element_offsets(l.shape, l.stride)) {
      const int64_t at = byte_off + off * l.itemsize();
      out.insert(out.end(), s.begin() + at, s.begin() + at + l.itemsize());
    }
    return out;
  }
  void write(int sid, int64_t byte_off, const Layout& l, const std::vector<uint8_t>& elements) {
    std::vector<uint8_t>& s = storages.at(sid);
    size_t k = 0;
    for (int64_t off : model::element_offsets(l.shape, l.stride)) {
      for (int64_t b = 0; b < l.itemsize(); ++b)
        s[byte_off + off * l.itemsize() + b] = elements[k++];
    }
  }

  /// replace_parameter (and set_kernel_parameter when `kernel`).
  void replace(const std::string& name, const NewTensor& t, bool whole, bool kernel) {
    const int sid = add_storage(initial_bytes(t));
    const Layout& fresh = t.layout;
    const std::vector<uint8_t> values = read(sid, fresh.offset * fresh.itemsize(), fresh);
    auto slot = slots.find(name);
    int oid = slot == slots.end() ? -1 : slot->second;
    if (oid < 0) {
      // A new parameter object on new's data.
      oid = next_oid++;
      ObjectModel o;
      o.layout = fresh;
      o.sid = sid;
      o.shuffled = t.shuffled;
      objects[oid] = o;
      if (slot == slots.end()) order.push_back(name);
      slots[name] = oid;
    } else {
      ObjectModel& o = objects.at(oid);
      model::FitQuery q;
      q.old_itemsize = o.layout.itemsize();
      q.old_numel = o.layout.numel();
      q.old_span = o.layout.span();
      q.old_offset = o.layout.offset;
      q.storage_nbytes = static_cast<int64_t>(storages.at(o.sid).size());
      q.new_itemsize = fresh.itemsize();
      q.new_numel = fresh.numel();
      q.new_span = fresh.span();
      q.same_data_ptr = q.storage_nbytes == 0 && t.storage_nbytes() == 0;
      q.whole_storage = whole;
      if (o.layout.shape == fresh.shape && o.layout.stride == fresh.stride &&
          o.layout.dtype == fresh.dtype) {
        write(o.sid, byte_offset(o), o.layout, values);  // in place
        ++events["copied in place"];
      } else if (model::places(q)) {
        const int64_t at = byte_offset(o);
        write(o.sid, at, fresh, values);
        const bool grown = fresh.span() * fresh.itemsize() > o.layout.span() * o.layout.itemsize();
        ++events[grown ? "grown in its own storage" : "placed in its own storage"];
        o.layout = fresh;
        o.layout.offset = at / fresh.itemsize();
      } else {
        o.layout = fresh;
        o.sid = sid;
      }
      if (t.shuffled >= 0) o.shuffled = t.shuffled;
    }
    if (kernel) {
      ObjectModel& o = objects.at(oid);
      o.retired = false;
      if (!o.runtime_name.empty()) o.runtime_name = name;
    }
  }

  /// kernel_parameters: (name, object id) pairs.
  std::vector<std::pair<std::string, int>> kernel_parameters() const {
    std::vector<std::pair<std::string, int>> out;
    std::map<int, std::string> listed;
    for (const std::string& name : order) {
      const int oid = slots.at(name);
      if (oid < 0 || !live(oid)) continue;
      auto it = listed.find(oid);
      if (it == listed.end()) {
        listed[oid] = name;
        out.emplace_back(name, oid);
      } else if (objects.at(oid).runtime_name == name && flaw != Flaw::kModelIgnoresRuntimeName) {
        const std::string first = it->second;
        out.erase(
            std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == first; }));
        out.emplace_back(name, oid);
        it->second = name;
      }
    }
    return out;
  }
  /// Whether kernel_parameters lists an object under a name that is not the
  /// first one holding it.
  bool lists_a_runtime_name() const {
    for (const auto& [name, oid] : kernel_parameters()) {
      for (const std::string& first : order) {
        if (slots.at(first) == oid) {
          if (first != name) return true;
          break;
        }
      }
    }
    return false;
  }
  bool live(int oid) const {
    const ObjectModel& o = objects.at(oid);
    return !o.retired && o.layout.numel() > 0;
  }
};

// ---------------------------------------------------------------------------
// The system under test

struct Sut {
  Layer layer;
  std::map<int, at::Tensor> objects;     // model object id -> the object
  std::map<int, c10::Storage> storages;  // model storage id -> the storage
  std::map<int, uintptr_t> data;         // model storage id -> its data pointer when made
  Flaw flaw = Flaw::kNone;
  std::set<std::string> events;  // what the sequence exercised, for classification

  at::Tensor make(int sid, const NewTensor& t) {
    const std::vector<uint8_t> bytes = initial_bytes(t);
    c10::Storage s = make_storage(t.storage_nbytes(), 0);
    if (!bytes.empty()) std::memcpy(s.mutable_data(), bytes.data(), bytes.size());
    storages[sid] = s;
    data[sid] = address(s.data());
    at::Tensor tensor =
        view_on(s, t.layout.dtype, t.layout.offset, t.layout.shape, t.layout.stride);
    if (t.shuffled >= 0) set_attr(tensor, "is_shuffled", t.shuffled != 0);
    return tensor;
  }
};

/// Takes hold of the objects the model says a command created, and checks
/// each is an object not seen before.
void adopt_new_objects(const Model& m, Sut& sut) {
  for (const auto* table : {&m.slots, &m.derived}) {
    for (const auto& [name, oid] : *table) {
      if (oid < 0 || sut.objects.count(oid) != 0) continue;
      const at::Tensor obj = sut.layer.get(name);
      RC_ASSERT(obj.defined());
      for (const auto& [other, known] : sut.objects) RC_ASSERT(!obj.is_same(known));
      sut.objects[oid] = obj;
    }
  }
}

std::optional<std::string> string_attr(const at::Tensor& t, const std::string& key) {
  const std::optional<AttrValue> v = find_attr(t, key);
  if (!v) return std::nullopt;
  const auto* s = std::get_if<std::string>(&*v);
  return s ? std::optional<std::string>(*s) : std::optional<std::string>("<not a string>");
}

/// Checks everything the model knows against the system.
void check_system(const Model& m, Sut& sut) {
  const Layer& layer = sut.layer;
  for (const std::string& name : param_names()) {
    auto it = m.slots.find(name);
    if (it == m.slots.end()) {
      RC_ASSERT(kind_name(layer.kind(name)) == kind_name(SlotKind::kAbsent));
      continue;
    }
    RC_ASSERT(kind_name(layer.kind(name)) == kind_name(SlotKind::kParameter));
    const at::Tensor held = layer.get(name);
    if (it->second < 0) {
      RC_ASSERT(!held.defined());
    } else {
      RC_ASSERT(held.is_same(sut.objects.at(it->second)));
    }
    const at::Tensor live = get_live_param(layer, name);
    RC_ASSERT(live.defined() == (it->second >= 0 && m.live(it->second)));
    if (live.defined()) RC_ASSERT(live.is_same(held));
  }
  for (const std::string& name : derived_names()) {
    auto it = m.derived.find(name);
    RC_ASSERT(kind_name(layer.kind(name)) ==
              kind_name(it == m.derived.end() ? SlotKind::kAbsent : SlotKind::kAttribute));
    if (it == m.derived.end()) continue;
    const at::Tensor held = layer.get(name);
    const bool as_modelled =
        it->second < 0 ? !held.defined() : held.is_same(sut.objects.at(it->second));
    RC_ASSERT(as_modelled);
  }
  std::vector<std::string> order;
  for (const auto& [name, param] : layer.parameter_slots()) order.push_back(name);
  RC_ASSERT(order == m.order);

  for (const auto* table : {&m.slots, &m.derived}) {
    for (const auto& [name, oid] : *table) {
      if (oid < 0) continue;
      const ObjectModel& o = m.objects.at(oid);
      const at::Tensor& obj = sut.objects.at(oid);
      RC_ASSERT(obj.sizes() == c10::IntArrayRef(o.layout.shape));
      RC_ASSERT(obj.strides() == c10::IntArrayRef(o.layout.stride));
      RC_ASSERT(obj.scalar_type() == o.layout.dtype);
      RC_ASSERT(obj.storage_offset() == o.layout.offset);
      RC_ASSERT(storage_id(obj.storage()) == storage_id(sut.storages.at(o.sid)));
      RC_ASSERT(address(obj.storage().data()) == sut.data.at(o.sid));
      RC_ASSERT(is_parameter(obj) == o.parameter);
      RC_ASSERT(attr_truthy(obj, "retired") == o.retired);
      const std::optional<std::string> runtime = string_attr(obj, "runtime_name");
      RC_ASSERT(runtime.value_or("") == o.runtime_name);
      const std::optional<AttrValue> shuffled = find_attr(obj, "is_shuffled");
      RC_ASSERT((!shuffled ? -1 : truthy(*shuffled) ? 1 : 0) == o.shuffled);
    }
  }
  for (const auto& [sid, bytes] : m.storages) {
    const c10::Storage& s = sut.storages.at(sid);
    RC_ASSERT(address(s.data()) == sut.data.at(sid));
    RC_ASSERT(s.nbytes() == bytes.size());
    RC_ASSERT(storage_bytes(s) == bytes);
  }
  std::vector<std::pair<std::string, int>> listed;
  for (const auto& [name, param] : kernel_parameters(layer)) {
    int oid = -1;
    for (const auto& [id, obj] : sut.objects) {
      if (obj.is_same(param)) oid = id;
    }
    listed.emplace_back(name, oid);
  }
  RC_ASSERT(listed == m.kernel_parameters());
}

// ---------------------------------------------------------------------------
// Commands

using Command = rc::state::Command<Model, Sut>;

/// A command whose effect on the model may be an error (the system must then
/// throw and change nothing the model tracks).
struct ModelledCommand : Command {
  /// Applies the command to `m`; returns false (changing nothing) when the
  /// specification says the call fails.
  virtual bool step(Model& m) const = 0;
  /// Does the call on the system.
  virtual void call(const Model& s0, Sut& sut) const = 0;

  void apply(Model& m) const override { step(m); }
  void run(const Model& s0, Sut& sut) const override {
    Model s1 = s0;
    const bool succeeds = step(s1);
    bool threw = false;
    try {
      call(s0, sut);
    } catch (const c10::Error& e) {
      threw = true;
      RC_LOG() << "threw: " << e.what_without_backtrace() << "\n";
    }
    RC_ASSERT(threw == !succeeds);
    RC_ASSERT(!direct_reload_enabled());
    adopt_new_objects(s1, sut);
    check_system(s1, sut);
    for (const auto& [event, count] : s1.events) sut.events.insert(event);
    if (s1.lists_a_runtime_name()) sut.events.insert("listed under a runtime name");
  }
};

struct ReplaceParameter : ModelledCommand {
  std::string name;
  NewTensor tensor;
  bool direct = false;
  bool kernel = false;  // set_kernel_parameter

  explicit ReplaceParameter(const Model& m, bool kernel_parameter = false)
      : kernel(kernel_parameter) {
    name = *rc::gen::elementOf(param_names());
    tensor = *gen_new_tensor(m.held_layout(name));
    direct = *rc::gen::arbitrary<bool>();
  }
  bool step(Model& m) const override {
    m.replace(name, tensor, direct, kernel);
    return true;
  }
  void call(const Model& s0, Sut& sut) const override {
    const at::Tensor t = sut.make(s0.next_sid, tensor);
    DirectReloadScope scope(direct);
    if (kernel) {
      set_kernel_parameter(sut.layer, name, t);
    } else {
      replace_parameter(sut.layer, name, t);
    }
  }
  void show(std::ostream& os) const override {
    os << (kernel ? "set_kernel_parameter(" : "replace_parameter(") << name << ", " << tensor << ")"
       << (direct ? " in a direct reload" : "");
  }
};

struct SetKernelParameter : ReplaceParameter {
  explicit SetKernelParameter(const Model& m) : ReplaceParameter(m, true) {}
};

struct MoveParameter : ModelledCommand {
  std::string src, dst;

  explicit MoveParameter(const Model&) {
    src = *rc::gen::elementOf(param_names());
    dst = *rc::gen::elementOf(param_names());
  }
  bool step(Model& m) const override {
    auto s = m.slots.find(src);
    if (s == m.slots.end() || s->second < 0) return false;
    auto d = m.slots.find(dst);
    if (d != m.slots.end() && d->second >= 0 && d->second != s->second) return false;
    const int oid = s->second;
    if (d == m.slots.end()) m.order.push_back(dst);
    m.slots[dst] = oid;
    m.objects.at(oid).runtime_name = dst;
    return true;
  }
  void call(const Model&, Sut& sut) const override { move_parameter(sut.layer, src, dst); }
  void show(std::ostream& os) const override {
    os << "move_parameter(" << src << ", " << dst << ")";
  }
};

struct RetireParameter : ModelledCommand {
  std::string name;

  explicit RetireParameter(const Model&) { name = *rc::gen::elementOf(param_names()); }
  bool step(Model& m) const override {
    const int oid = m.held(name);
    if (oid < 0) return false;
    m.objects.at(oid).retired = true;
    return true;
  }
  void call(const Model&, Sut& sut) const override { retire_parameter(sut.layer, name); }
  void show(std::ostream& os) const override { os << "retire_parameter(" << name << ")"; }
};

struct RefillDerived : ModelledCommand {
  std::string name;
  std::optional<NewTensor> tensor;

  explicit RefillDerived(const Model& m) {
    // Mostly a derived name; sometimes a registered parameter's, which must be
    // refused.
    name = *rc::gen::elementOf(derived_names());
    if (!m.order.empty() && *rc::gen::weightedElement<bool>({{6, false}, {1, true}})) {
      name = *rc::gen::elementOf(m.order);
    }
    if (*rc::gen::weightedElement<bool>({{9, true}, {1, false}})) {
      NewTensor t = *gen_new_tensor(std::nullopt);
      const std::optional<Layout> held = m.held_layout(name);
      if (held && *rc::gen::arbitrary<bool>()) {
        // Same shape and dtype: a refill, of a tensor that owns its storage
        // when it was made with offset 0 and no slack.
        t.layout = *gen_layout_of(held->shape, held->dtype, state_layouts());
      }
      if (*rc::gen::arbitrary<bool>()) {
        t.layout.offset = 0;
        t.slack = 0;
      }
      tensor = t;
    }
  }
  // The pools of names stay apart: a parameter name is refilled only once it
  // is registered (shrinking may drop the command that registered it).
  void checkPreconditions(const Model& m) const override {
    RC_PRE(m.slots.count(name) != 0 ||
           std::count(derived_names().begin(), derived_names().end(), name) != 0);
  }
  bool step(Model& m) const override {
    // new's storage is tracked (and must stay unchanged) whatever happens.
    const int sid = tensor ? m.add_storage(initial_bytes(*tensor)) : -1;
    if (m.slots.count(name) != 0) return false;  // a parameter: refused
    const int oid = m.held(name);
    if (oid >= 0 && tensor) {
      const ObjectModel& o = m.objects.at(oid);
      const Layout& fresh = tensor->layout;
      if (o.layout.shape == fresh.shape && o.layout.dtype == fresh.dtype) {
        // An empty held tensor writes nothing, so it counts as owning it.
        const bool owns =
            o.layout.numel() == 0 || (o.layout.offset == 0 &&
                                      o.layout.span() * o.layout.itemsize() ==
                                          static_cast<int64_t>(m.storages.at(o.sid).size()) &&
                                      o.layout.span() >= o.layout.numel());
        if (!owns) return false;
        m.write(o.sid, 0, o.layout, m.read(sid, fresh.offset * fresh.itemsize(), fresh));
        ++m.events["refilled in place"];
        return true;
      }
    }
    if (!tensor) {
      m.derived[name] = -1;
      return true;
    }
    ObjectModel o;
    o.layout = tensor->layout;
    o.sid = sid;
    o.parameter = false;
    o.shuffled = tensor->shuffled;
    m.objects[m.next_oid] = o;
    m.derived[name] = m.next_oid++;
    return true;
  }
  void call(const Model& s0, Sut& sut) const override {
    const at::Tensor t = tensor ? sut.make(s0.next_sid, *tensor) : at::Tensor();
    refill_derived(sut.layer, name, t);
  }
  void show(std::ostream& os) const override {
    os << "refill_derived(" << name << ", ";
    if (tensor) {
      os << *tensor;
    } else {
      os << "None";
    }
    os << ")";
  }
};

struct WholeReload : ModelledCommand {
  uint64_t seed = 0;
  std::vector<std::pair<std::string, NewTensor>> post;  // set_kernel_parameter, direct

  explicit WholeReload(const Model& m) {
    seed = *rc::gen::arbitrary<uint64_t>();
    for (const std::string& name : m.order) {
      if (*rc::gen::weightedElement<bool>({{1, false}, {2, true}})) {  // shrinks to fewer
        post.emplace_back(name, *gen_new_tensor(m.held_layout(name)));
      }
    }
  }
  /// New values for the k-th distinct object, as element bytes.
  static std::vector<uint8_t> values(uint64_t seed, size_t k, const Layout& l) {
    Layout dense = l;
    dense.stride = contiguous_strides(l.shape);
    dense.offset = 0;
    return random_bytes(l.numel() * l.itemsize(), seed + 7919 * k, 0, &dense);
  }
  bool step(Model& m) const override {
    std::vector<int> loaded;
    for (const std::string& name : m.order) {
      const int oid = m.slots.at(name);
      if (oid < 0 || std::count(loaded.begin(), loaded.end(), oid)) continue;
      ObjectModel& o = m.objects.at(oid);
      m.write(o.sid, m.byte_offset(o), o.layout, values(seed, loaded.size(), o.layout));
      loaded.push_back(oid);
    }
    for (const auto& [name, t] : post) m.replace(name, t, /*whole=*/true, /*kernel=*/true);
    return true;
  }
  void call(const Model& s0, Sut& sut) const override {
    // Load: through each registered object's data, as a weight loader does.
    std::vector<at::Tensor> loaded;
    for (const auto& [name, param] : sut.layer.parameter_slots()) {
      if (!param.defined()) continue;
      bool seen = false;
      for (const at::Tensor& l : loaded) seen = seen || l.is_same(param);
      if (seen) continue;
      const Layout l{param.scalar_type(), shape_of(param), stride_of(param), 0};
      const std::vector<uint8_t> bytes = values(seed, loaded.size(), l);
      at::Tensor src = at::empty(l.shape, at::TensorOptions().dtype(l.dtype));
      if (!bytes.empty()) std::memcpy(src.mutable_data_ptr(), bytes.data(), bytes.size());
      at::Tensor data = param.detach();
      ScopedIntegratedGpuOverride integrated(true);
      copy_weight_(data, src);
      loaded.push_back(param);
    }
    // Post-process, in a direct reload.
    DirectReloadScope scope(sut.flaw != Flaw::kSutReloadsWithoutDirect);
    int sid = s0.next_sid;
    for (const auto& [name, t] : post) set_kernel_parameter(sut.layer, name, sut.make(sid++, t));
  }
  void show(std::ostream& os) const override {
    os << "whole reload(seed " << seed << "), then in a direct reload:";
    for (const auto& [name, t] : post) os << " set_kernel_parameter(" << name << ", " << t << ");";
  }
};

void layer_state_property(Flaw flaw) {
  Model initial;
  initial.flaw = flaw;
  Sut sut;
  sut.flaw = flaw;
  rc::state::check(
      initial, sut,
      rc::state::gen::execOneOfWithArgs<ReplaceParameter, ReplaceParameter, SetKernelParameter,
                                        MoveParameter, RetireParameter, RefillDerived,
                                        WholeReload>());
  for (const char* event : {"placed in its own storage", "grown in its own storage",
                            "refilled in place", "listed under a runtime name"}) {
    RC_CLASSIFY(sut.events.count(event) != 0, event);
  }
}

RC_GTEST_PROP(LayerStateProps, ReloadSequencesKeepNamesObjectsAndAddresses, ()) {
  layer_state_property(Flaw::kNone);
}

void expect_caught(Flaw flaw) {
  const Falsified f = check_quietly([flaw] { layer_state_property(flaw); }, 300);
  ASSERT_TRUE(f.failed) << "the property did not catch the flaw:\n" << f.counterexample;
  std::cout << "caught after " << f.cases << " cases:\n" << f.counterexample << "\n";
}

TEST(LayerStateMutants, AModelThatIgnoresRuntimeNamesIsCaught) {
  expect_caught(Flaw::kModelIgnoresRuntimeName);
}

TEST(LayerStateMutants, ReloadingOutsideADirectReloadIsCaught) {
  expect_caught(Flaw::kSutReloadsWithoutDirect);
}

}  // namespace
}  // namespace reloadsafe::fuzz
