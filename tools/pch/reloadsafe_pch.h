// reloadsafe_pch.h: the LibTorch header every user of utils/layer.h parses,
// precompiled once per build configuration (//tools/pch, tools/pch.bzl).
//
// A source of a target that tools/defs.bzl's macros build with `pch = True`
// gets this header first (`-include reloadsafe_pch.h`), which gcc answers
// from the parsed form beside it. Nothing of the project is here: only what
// utils/layer.h includes, which every source of such a target includes.
//
// Invariant: only LibTorch's headers, each of which the project's sources
// include themselves where they use it; a source never relies on this header
// for a declaration (the builds without it, pip's and the libFuzzer one,
// compile every source alone).
//
// No `#pragma once`: gcc compiles this file as a main file, where it warns
// about one, and `-include` reads it once per source.

#include <torch/nn/module.h>
