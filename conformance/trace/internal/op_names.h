// op_names.h: an op's "ns::op.overload" name, made once per process.
//
// A trace names every op call it records; copying a string per call was a
// trace's most frequent allocation. op_name() hands out a view of one
// interned string per distinct name instead.
//
// Invariant: a view op_name() returns stays valid for the life of the
// process (the strings are never freed), and names exactly the schema it
// was asked for, even when a schema freed with its library leaves its
// address to another (Note [Op names] in op_names.cc).
#pragma once

#include <ATen/core/function_schema.h>

#include <string_view>

namespace reloadsafe::trace {

/// "aten::add.Tensor" ("aten::mm" where the overload name is empty), as a
/// view of a string that lives as long as the process. Thread-safe.
std::string_view op_name(const c10::FunctionSchema& schema);

/// The same name for an op known by its schema's name and overload name
/// ("aten::add", "Tensor"), as a RecordFunction reports them: views of
/// strings its schema owns, which the slot lookup keys on. Thread-safe.
std::string_view op_name(const char* name, const char* overload);

/// Whether `full` is the name op_name() gives `schema`, told without making
/// a string.
bool is_name_of(std::string_view full, const c10::FunctionSchema& schema);

/// Whether `full` is "`name`.`overload`" ("`name`" where `overload` is empty).
bool is_name_of(std::string_view full, std::string_view name, std::string_view overload);

}  // namespace reloadsafe::trace
