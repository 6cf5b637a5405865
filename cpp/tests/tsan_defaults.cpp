// SPDX-License-Identifier: Apache-2.0
// ThreadSanitizer settings of the C++ unit tests (FEEDLINE_TSAN=ON, dev/test --full),
// compiled into the test binary so that ctest and a direct run behave alike; empty in
// every other build. TSAN_OPTIONS in the environment still overrides the options.
//
// One suppression, of a known false positive: std::exception_ptr counts its references
// with atomics inside libstdc++.so, which is not built with -fsanitize=thread, so TSan
// does not see the synchronization. An engine thread that drops the last reference to a
// submission's error (StorageFailure, CorruptData) deletes the exception after the
// caller read it through rethrow_exception(); TSan calls that a race on the exception's
// strings. Only reports with an `__exception_ptr` frame (its _M_release / _M_addref)
// are suppressed. Known elsewhere: arangodb/arangodb#21084, ex-actor/ex-actor#247.
#if defined(__SANITIZE_THREAD__)
#define FEEDLINE_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FEEDLINE_TSAN_BUILD 1
#endif
#endif

#if defined(FEEDLINE_TSAN_BUILD)
extern "C" const char* __tsan_default_options() {
  // exit code 66 on any report (TSan's default) fails the test; keep both stacks of a
  // lock-order inversion
  return "second_deadlock_stack=1";
}

extern "C" const char* __tsan_default_suppressions() { return "race:__exception_ptr\n"; }
#endif
