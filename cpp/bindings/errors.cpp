// SPDX-License-Identifier: Apache-2.0
// Translate native exceptions into feedline's Python exception classes. The classes live
// in feedline.errors and are looked up when an error happens, so the module imports
// without the package (stub generation imports it bare).
#include <feedline/errors.hpp>

#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {
nb::object error_class(const char* name, PyObject* fallback) {
  try {
    return nb::module_::import_("feedline.errors").attr(name);
  } catch (...) {
    PyErr_Clear();
    return nb::borrow(fallback);
  }
}
}  // namespace

void register_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const CorruptData& e) {
      nb::object cls = error_class("CorruptDataError", PyExc_ValueError);
      nb::object args = nb::make_tuple(e.path, e.offset, e.reason);
      PyErr_SetObject(cls.ptr(), args.ptr());
    } catch (const Unsupported& e) {
      nb::object cls = error_class("UnsupportedFormatError", PyExc_ValueError);
      nb::object args = nb::make_tuple(e.path, e.reason);
      PyErr_SetObject(cls.ptr(), args.ptr());
    } catch (const StorageFailure& e) {
      nb::object cls = error_class("StorageError", PyExc_OSError);
      nb::object args = nb::make_tuple(e.path, e.offset, e.err, std::string(e.what()));
      PyErr_SetObject(cls.ptr(), args.ptr());
    }
  });
}

}  // namespace feedline::py
