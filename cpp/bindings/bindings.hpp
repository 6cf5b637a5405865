// One registration function per binding file; module.cpp calls them all.
#pragma once
#include <nanobind/nanobind.h>

namespace feedline::py {
void register_errors(nanobind::module_& m);
void register_lmdb(nanobind::module_& m);
void register_codecs(nanobind::module_& m);
void register_io(nanobind::module_& m);
}  // namespace feedline::py
