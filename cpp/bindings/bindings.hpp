// SPDX-License-Identifier: Apache-2.0
// One registration function per binding file; module.cpp calls them all.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace feedline::py {
/// A C-contiguous CPU array of T with D dimensions: what the bindings take and fill.
template <class T, std::size_t D = 1>
using CArray = nanobind::ndarray<T, nanobind::ndim<D>, nanobind::c_contig, nanobind::device::cpu>;

/// A numpy array that takes ownership of *v* (freed with the array).
template <class T>
nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nanobind::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>>(heap->data(), {heap->size()},
                                                                  owner);
}

void register_errors(nanobind::module_& m);
void register_lmdb(nanobind::module_& m);
void register_codecs(nanobind::module_& m);
void register_unpack(nanobind::module_& m);
void register_io(nanobind::module_& m);
void register_sync(nanobind::module_& m);
void register_plan(nanobind::module_& m);
void register_records(nanobind::module_& m);
void register_handoff(nanobind::module_& m);

/// Remember which thread is the interpreter's main thread (module.cpp, at import).
void note_main_thread();

/// PyEval_RestoreThread(state), except in a thread other than the main thread once the
/// interpreter is finalizing: there the thread is parked for good instead.
///
/// Why: CPython < 3.14 ends a thread that asks for the GIL during Py_FinalizeEx with
/// pthread_exit(). Its forced unwind then runs through this noexcept frame (and
/// nanobind's catch (...) above it), which calls std::terminate: "terminate called
/// without an active exception", SIGABRT at exit, whenever a daemon thread returns
/// from a GIL-free call (an engine wait, a read) while the main thread shuts down.
/// Parking is what CPython 3.14 itself does with such threads; the process exits
/// around them.
void reacquire_gil(PyThreadState* state) noexcept;

/// nb::gil_scoped_release whose reacquisition is reacquire_gil(): use it (directly or
/// as nb::call_guard<ReleaseGil>) for every call that drops the GIL.
class ReleaseGil {
 public:
  ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() { reacquire_gil(state_); }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};
}  // namespace feedline::py
