// call_match.h: when a retraced op call is the captured one.
//
// After a reload the forward is traced again and every call is set against
// the call the capture recorded at the same position. This file holds the one
// rule for that, in its two forms: same_call() between two records (used by
// CapturedForward::compare and replays_as, capture.h), and is_expected_call()
// between a record and a call about to be made, told from the call's
// arguments without recording it (the skip path of a checking retrace, which
// runs on every op of the forward). Both give the same answer for the same
// call: is_expected_call() answers true only where the record would satisfy
// same_call(), and false wherever it cannot tell cheaply. It also holds the
// fingerprint of a top-level call's other arguments (numbers, shapes, flags),
// which both forms compare.
//
// Invariant: nothing here runs an op, touches a storage's bytes or keeps a
// tensor; a storage is classified and an opaque object asked for its
// tensors only through the functions the caller passes (the trace's own
// rules, read_trace.h).
#pragma once

#include "conformance/trace/trace_records.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/FunctionRef.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace reloadsafe::trace {

/// The fingerprint of a top-level call's `num_args` arguments (Note [The
/// other arguments' fingerprint] in call_match.cc), or nothing if one has no
/// fingerprint.
std::optional<uint64_t> fingerprint_of(const c10::IValue* args, size_t num_args);

/// Whether `retraced` is the op `captured` is in shape: the same op at the
/// same depth, with as many reads and objects.
bool same_op(const OpCall& captured, const OpCall& retraced);

/// The same object: the same C++ instance where the objects hold one (a
/// TorchBind object handed from C++ gets a new script object on every call),
/// else the same script object.
bool same_object(const ObjectRead& captured, const ObjectRead& retraced);

/// Whether the retraced call `retraced` is the captured call `captured` in
/// every respect a retrace is judged by: the same op at the same depth with
/// as many reads and objects; the same objects; every read taken from the
/// same argument and element, external, subclass and storage-less alike,
/// and an external one at the same place (TensorLocation::same_place); for
/// a top-level call, other arguments known and equal. A retrace made of
/// such calls has nothing to report and is its own replay.
bool same_call(const OpCall& captured, const OpCall& retraced);

/// How a caller of is_expected_call() classifies a tensor argument with a
/// plain storage: external (true) or made by the traced code (false), by
/// the rule a record uses; nothing while the classification may still
/// change (a provisional storage, Note [Inside or before the scope] in
/// read_trace.cc).
using ClassifyArgument = c10::function_ref<std::optional<bool>(const at::Tensor&)>;

/// How a caller of is_expected_call() tells an opaque object argument
/// (`object`, argument `arg`) against the captured `expected`: false if it
/// is not that object; else true, after `on_read(tensor, index)` for every
/// tensor a record would read from it, in the record's order
/// (ReadTrace::match_object). Asking an object runs its code: that is the
/// caller's, not this file's.
using MatchObject =
    c10::function_ref<bool(const ObjectRead& expected, const c10::IValue& object, int arg,
                           c10::function_ref<void(const at::Tensor&, int)> on_read)>;

/// Whether a call of `schema` at `depth` with `args[0..num_args)` would be
/// recorded as a call same_call() to `expected`, told from the arguments
/// without a record. False also where that cannot be told cheaply: an opaque
/// object when `match_object` is null, a tensor without a plain storage, a
/// provisional classification, a top-level call whose arguments are
/// unknown. An object's reads are told like the call's own, each by the
/// object's argument and its index among the object's reads. A nested call
/// whose arguments are unknown (`num_args` 0 for a schema with arguments) is
/// recorded without reads, and is the expected call where that one has
/// none either (is_expected_named_call). `classify` may classify a storage
/// seen for the first time.
///
/// With `callees_alike`, also whether such a call, an ATen op whose callees
/// were recorded by name (OpCall::callees_named), would choose the ops it
/// calls as the captured one did (Note [A retrace that knows an ATen op's
/// callees] in capture.cc): every tensor argument in the captured layout,
/// made ones included (the answer above looks only at an external one's
/// place), and for a nested call, whose fingerprint the answer above does
/// not compare, the other arguments' fingerprint known and equal. False
/// wherever the answer above is.
bool is_expected_call(const OpCall& expected, int depth, const c10::FunctionSchema& schema,
                      const c10::IValue* args, size_t num_args, ClassifyArgument classify,
                      MatchObject match_object = nullptr, bool* callees_alike = nullptr);

/// Whether a nested call (`depth` > 0) known by its name only (Note [Inside
/// an ATen op] in read_trace.cc), which is recorded without reads or
/// objects, would be recorded as a call same_call() to `expected`.
bool is_expected_named_call(const OpCall& expected, int depth, std::string_view name);

}  // namespace reloadsafe::trace
