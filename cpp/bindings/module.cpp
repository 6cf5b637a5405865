// SPDX-License-Identifier: Apache-2.0
#include "bindings.hpp"

#include <feedline/version.hpp>

#include <unistd.h>

#include <atomic>
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace feedline::py {
namespace {
std::atomic<unsigned long> g_main_thread{0};

bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}
}  // namespace

void note_main_thread() {
  unsigned long ident = 0;
  try {
    ident = nanobind::cast<unsigned long>(
        nanobind::module_::import_("threading").attr("main_thread")().attr("ident"));
  } catch (...) {  // the importing thread's ident
    ident = PyThread_get_thread_ident();
  }
  g_main_thread.store(ident, std::memory_order_relaxed);
}

[[noreturn]] void park() noexcept {
  for (;;) ::pause();
}

void reacquire_gil(PyThreadState* state) noexcept {
  // The main thread is the one that finalizes: it must always get the GIL back (it may
  // close an engine from a finalizer). Any other thread would be killed by take_gil().
  if (finalizing() &&
      PyThread_get_thread_ident() != g_main_thread.load(std::memory_order_relaxed)) {
    park();
  }
#if defined(__GLIBCXX__)
  // The check above races with the main thread: it may start finalizing while this
  // thread waits for the GIL, and take_gil() then calls pthread_exit(). Catch that
  // forced unwind here and park inside the handler: the unwind is abandoned, never
  // swallowed (leaving the handler without rethrowing would abort), and it never
  // reaches a noexcept frame.
  try {
    PyEval_RestoreThread(state);
  } catch (abi::__forced_unwind&) {
    park();
  }
#else
  PyEval_RestoreThread(state);
#endif
}
}  // namespace feedline::py

NB_MODULE(_core, m) {
  m.doc() = "feedline native core: LMDB page parser, codecs, I/O engine.";
  m.attr("__version__") = feedline::version();
  // Engines are left alive on purpose at exit in two cases: one abandoned over a stalled
  // read (its thread may still be blocked in the kernel) and a forked child's copies of
  // its parent's engines (freeing them there is not safe). nanobind's shutdown leak
  // report would print a page of "leaked instance" noise for those.
  nanobind::set_leak_warnings(false);
  feedline::py::note_main_thread();
  feedline::py::register_errors(m);
  feedline::py::register_lmdb(m);
  feedline::py::register_codecs(m);
  feedline::py::register_unpack(m);
  feedline::py::register_io(m);
  feedline::py::register_sync(m);
  feedline::py::register_plan(m);
  feedline::py::register_records(m);
  feedline::py::register_handoff(m);
}
