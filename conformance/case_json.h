// case_json.h: typed readers for the JSON of a case (golden/FORMAT.md).
//
// A case is untrusted input: any field may be missing, of another JSON type,
// out of range or absurdly nested. Every reader here either returns a value
// of the type the case format promises or throws a c10::Error whose message
// names the field (`what`, e.g. "old.shape[1]") and what was wrong with it;
// the runner turns that message into the case's error line.
//
// Invariant: reading never allocates tensor memory and never recurses on the
// input's nesting (parse_case bounds it with nlohmann-json's own parser
// callback, so a hostile line cannot exhaust the stack).
//
// Usage:
//   const Json c = parse_case(line);
//   const std::vector<int64_t> shape = as_int_list(required(c, "shape", "the case"), "shape");
#pragma once

#include "utils/tensor_attrs.h"

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace reloadsafe::conformance {

/// A case as read (keys in any order).
using Json = nlohmann::json;
/// A result, keys in the order golden/FORMAT.md lists them.
using OJson = nlohmann::ordered_json;

/// The deepest nesting of JSON arrays and objects a case line may have (a
/// guard against stack exhaustion on hostile input). The parser stops at the
/// first array or object beyond it, so such a line reports no id.
inline constexpr int kMaxJsonDepth = 64;

/// Parses one case line. Throws nlohmann::json::parse_error on bad JSON, and
/// a c10::Error as soon as arrays and objects nest deeper than
/// kMaxJsonDepth, before the rest of the line is read.
Json parse_case(const std::string& line);

/// A short rendering of a JSON value for error messages (at most 40 bytes).
std::string brief(const Json& v);

/// The field `key` of `obj`, or nullptr when absent (or `obj` is no object).
const Json* field(const Json& obj, const char* key);

/// The field `key` of `obj`, or nullptr when absent or null (None).
const Json* nullable(const Json& obj, const char* key);

/// The field `key` of `obj`; throws "<what> has no field '<key>'" if absent.
const Json& required(const Json& obj, const char* key, const std::string& what);

/// An integer that fits int64 (JSON numbers with a fraction are refused).
int64_t as_int(const Json& v, const std::string& what);

/// true or false (no truthiness: 0, 1 and strings are refused).
bool as_bool(const Json& v, const std::string& what);

/// A string.
std::string as_string(const Json& v, const std::string& what);

/// An array of integers that fit int64.
std::vector<int64_t> as_int_list(const Json& v, const std::string& what);

/// The boolean field `key`, or `fallback` when it is absent.
bool opt_bool(const Json& obj, const char* key, bool fallback);

/// A dtype by its case-format name ("uint8", "float32", "float8_e4m3fn", ...).
at::ScalarType as_dtype(const Json& v, const std::string& what);

/// The case-format name of a dtype (LibTorch's name for a dtype cases
/// cannot spell).
std::string dtype_name(at::ScalarType t);

/// An attributes object: strings, booleans, integers, and tensors written
/// `{"tensor": <integer or boolean, or an array of them>}` (an int64 or bool
/// CPU tensor, 0-dim for a single value). The names of the twelve tensor
/// properties FORMAT.md lists (`data`, `shape`, ...) are refused: Python
/// cannot set them on a tensor. Other names a tensor answers to (`size`,
/// `stride`, ...) pass, so set_weight_attrs itself can refuse them.
AttrMap as_attrs(const Json& v, const std::string& what);

/// The JSON form of an attribute value in results: the value itself, a
/// loader's name, or "<tensor>".
OJson attr_json(const AttrValue& value);

}  // namespace reloadsafe::conformance
