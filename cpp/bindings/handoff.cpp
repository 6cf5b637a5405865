// SPDX-License-Identifier: Apache-2.0
// feedline._core hand-over between a pass's producer thread and its consumer
// (pipeline/runner.py, pipeline/passes.py; docs/loader.md, "The hand-over").
//
//   Bell       a doorbell for one waiting thread (a futex word, not a lock)
//   Handoff    the batches the producer has put and not yet delivered, by step, and the
//              consumer's pace (what EpochRun.__next__ updates at every step)
//   Gate       the Loader's "one consumer at a time" flag (acquire(False) / release)
//   PassIter   base of pipeline.passes.Epoch: next() of a ready batch in C
//
// Every method runs with the GIL held (only Bell.wait releases it while it sleeps):
// the GIL orders the producer's put before the consumer's pop, as it ordered the dict
// of the Python hand-over this replaces.
//
// Why C: on a machine whose caches other processes cool between steps, next() of a
// ready batch cost 26-42 us in Python (three frames touching the Loader, the pass, the
// alarm and a dict) after a 2.9 ms training step, against ~4 us for a C iterator; the
// consumer pays it at every step of every pass. PassIter's tp_iternext makes exactly
// the checks of Epoch._slow_next (the Python path), in the same order, reading the
// Loader's and the alarm's attributes from their __dict__; whenever one of them is not
// the common case (first call, another thread, a fork, a broken or replaced pass, the
// alarm due, no ready batch, an error to raise, the end) it calls Epoch._slow_next(),
// which handles every case.
#include <feedline/doorbell.hpp>

#include <nanobind/nanobind.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
namespace {

// forks of this process so far (a child's count is its parent's plus one): a pass made
// before a fork sees another count in the child, a cheaper check than getpid()
std::atomic<std::uint64_t> g_forks{0};
void forked_child() noexcept { g_forks.fetch_add(1, std::memory_order_relaxed); }

// time.perf_counter() on Linux (CLOCK_MONOTONIC, in seconds)
double now_s() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// A doorbell for one waiting thread. The waiter raises `waiting`, re-checks its
/// condition, then wait()s; the ringer changes the state first and rings only when it
/// sees `waiting` (both under the GIL: no wake-up is lost). A ring nobody waited for is
/// kept: the next wait() returns at once and its caller re-checks, as after any
/// spurious wake-up. `urgent`, `wake_at`, `rings` and `waits` are the pacing state and
/// counters EpochRun keeps on its bells.
class Bell {
 public:
  bool ring(bool always) noexcept {
    if (waiting || always) {
      waiting = false;
      ++rings;
      doorbell_ring(&word_);
      return true;
    }
    return false;
  }

  void wait(double timeout_s) {
    ++waits;
    const std::uint32_t w = std::atomic_ref<std::uint32_t>(word_).load(std::memory_order_acquire);
    if (w == seen_) {
      ReleaseGil unlocked;
      doorbell_wait(&word_, w, timeout_s);
    }
    seen_ = std::atomic_ref<std::uint32_t>(word_).load(std::memory_order_acquire);
  }

  bool waiting = false;
  bool urgent = true;  // the waiter wants a ring at every change, not only when needed
  double wake_at = 0.0;
  std::uint64_t rings = 0;
  std::uint64_t waits = 0;

 private:
  alignas(4) std::uint32_t word_ = 0;
  std::uint32_t seen_ = 0;
};

/// What the producer put for one step.
struct Item {
  std::int64_t step = -1;  // -1: empty
  bool ok = false;
  nb::object value;
  std::int64_t samples = -1;  // len(batch.ids); -1: no ids; -2: not counted (Python path)
  std::int64_t nbytes = 0;
};

class Handoff {
 public:
  Handoff(std::int64_t first, std::int64_t last, std::int64_t depth, nb::object consumer,
          nb::object producer)
      : last(last), next_step(first), taken(first), taken_t(now_s()),
        consumer_bell(*nb::cast<Bell*>(consumer)),
        producer_bell(*nb::cast<Bell*>(producer)), bells_{std::move(consumer),
                                                          std::move(producer)} {
    // a slot per step the budget lets the producer be ahead (more spill into a map)
    std::size_t cap = 4;
    const auto want = static_cast<std::size_t>(std::clamp<std::int64_t>(depth, 1, 1024)) + 2;
    while (cap < want) cap <<= 1;
    ring_.resize(cap);
  }

  /// The producer: the batch (or exception) of *step* (a step put again replaces what
  /// it held); true when it woke a consumer that waited for it.
  bool put(std::int64_t step, bool ok, nb::object value, std::int64_t samples,
           std::int64_t nbytes) {
    if (step < 0) throw nb::value_error("Handoff.put: a step is >= 0");
    Item item{step, ok, std::move(value), samples, nbytes};
    if (Item* held = find(step)) {
      std::swap(*held, item);  // the old value is released when `item` goes
    } else if (Item& slot = ring_[index(step)]; slot.step < 0) {
      slot = std::move(item);
    } else {
      spill_[step] = std::move(item);  // never while the budget is kept; correct anyway
    }
    return consumer_bell.ring(false);
  }

  Item* find(std::int64_t step) {
    if (step < 0) return nullptr;
    Item& slot = ring_[index(step)];
    if (slot.step == step) return &slot;
    if (spill_.empty()) return nullptr;
    auto it = spill_.find(step);
    return it == spill_.end() ? nullptr : &it->second;
  }

  /// Take *item* out (it was found by find()): its value.
  nb::object take(Item* item) {
    nb::object v = std::move(item->value);
    Item& slot = ring_[index(item->step)];
    if (&slot == item) {
      slot.step = -1;
    } else {
      spill_.erase(item->step);  // item is not used after this
    }
    return v;
  }

  /// Drop every value held (releasing one may run a __del__ that calls back: the
  /// containers are emptied first, the values released after).
  void clear() {
    std::vector<Item> ring(ring_.size());
    std::unordered_map<std::int64_t, Item> spill;
    ring_.swap(ring);
    spill_.swap(spill);
  }

  /// Visit every value held (the garbage collector's traversal).
  int traverse(visitproc visit, void* arg) const {
    for (const Item& s : ring_) Py_VISIT(s.value.ptr());
    for (const auto& kv : spill_) Py_VISIT(kv.second.value.ptr());
    for (const nb::object& b : bells_) Py_VISIT(b.ptr());
    return 0;
  }

  /// The consumer came for a step at *t0*: its step period (moving average), which
  /// paces a waiting producer.
  void tick(double t0) noexcept {
    period += 0.25 * (t0 - taken_t - period);
    taken_t = t0;
  }

  /// The consumer is done with the batch before *step*: the producer may run one
  /// further. It is rung for; or it is pacing itself and would look too late (a long
  /// step).
  void release(std::int64_t step, double t0) noexcept {
    taken = step;
    Bell& b = producer_bell;
    if (b.urgent || (b.waiting && b.wake_at - t0 > period / 8)) b.ring(false);
  }

  std::size_t held() const noexcept {
    std::size_t n = spill_.size();
    for (const Item& s : ring_) n += s.step >= 0;
    return n;
  }

  std::int64_t last, next_step, taken;
  std::int64_t delivered = 0;
  double period = 0.0;
  double taken_t;
  bool closed = false;
  Bell& consumer_bell;   // rung by the producer when a batch is put
  Bell& producer_bell;   // rung by the consumer when it takes a step
  nb::object bells_[2];  // the two Bell objects (held: their Python side owns them)

 private:
  std::size_t index(std::int64_t step) const noexcept {
    return static_cast<std::size_t>(step) & (ring_.size() - 1);
  }
  std::vector<Item> ring_;
  std::unordered_map<std::int64_t, Item> spill_;
};

/// The Loader's one-consumer flag: held by iter() and next() while they run.
struct Gate {
  bool held = false;
  bool acquire(bool blocking) {
    if (blocking) throw nb::value_error("Gate.acquire: only acquire(False) is supported");
    if (held) return false;
    held = true;
    return true;
  }
  void release() {
    if (!held) throw nb::value_error("Gate.release: not held");
    held = false;
  }
};

// interned attribute names read from the Loader's and the alarm's __dict__
PyObject* k_broken = nullptr;
PyObject* k_run = nullptr;
PyObject* k_step = nullptr;
PyObject* k_delivered = nullptr;
PyObject* k_samples = nullptr;
PyObject* k_payload = nullptr;
PyObject* k_failure = nullptr;
PyObject* k_next_test = nullptr;
PyObject* k_slow_next = nullptr;

/// Base of pipeline.passes.Epoch (see the top of this file).
struct PassIter {
  void bind(const nb::object& loader, const nb::object& run, const nb::object& handoff,
            const nb::object& gate, const nb::object& alarm, double grace) {
    loader_ = loader;
    loader_dict_ = nb::steal(PyObject_GenericGetDict(loader.ptr(), nullptr));
    if (!loader_dict_.is_valid()) throw nb::python_error();
    run_ = run;
    handoff_ = handoff;
    h_ = handoff.is_none() ? nullptr : nb::cast<Handoff*>(handoff);
    gate_obj_ = gate;
    gate_ = nb::cast<Gate*>(gate);
    alarm_ = alarm;
    if (!alarm.is_none()) {
      alarm_dict_ = nb::steal(PyObject_GenericGetDict(alarm.ptr(), nullptr));
      if (!alarm_dict_.is_valid()) throw nb::python_error();
    }
    grace_ = grace;
    forks_ = g_forks.load(std::memory_order_relaxed);
  }

  // the fast path: a batch, or nullptr (no exception set) for the slow path
  PyObject* ready_batch() {
    Handoff* h = h_;
    if (h == nullptr || gate_ == nullptr || gate_->held) return nullptr;
    if (owner_ != PyThread_get_thread_ident() || forks_ != g_forks.load(std::memory_order_relaxed))
      return nullptr;
    PyObject* d = loader_dict_.ptr();
    PyObject* broken = PyDict_GetItemWithError(d, k_broken);
    if (broken != Py_None) return nullptr;  // broken, or the lookup failed
    if (PyDict_GetItemWithError(d, k_run) != run_.ptr()) return nullptr;  // replaced
    const std::int64_t step = h->next_step;
    if (h->closed || step >= h->last) return nullptr;
    Item* item = h->find(step);
    // a wait, an error to raise, or a batch the producer could not count (-2)
    if (item == nullptr || !item->ok || item->samples < -1) return nullptr;
    const double t0 = now_s();
    if (alarm_dict_.is_valid()) {
      PyObject* ad = alarm_dict_.ptr();
      if (PyDict_GetItemWithError(ad, k_failure) != Py_None) return nullptr;
      PyObject* next_test = PyDict_GetItemWithError(ad, k_next_test);
      if (next_test == nullptr || !PyFloat_CheckExact(next_test) ||
          t0 >= PyFloat_AS_DOUBLE(next_test) + grace_)
        return nullptr;  // the alarm's test is due: Alarm.poll, in Python
    }
    if (PyErr_Occurred()) return nullptr;  // a failed lookup: the slow path sees it too
    gate_->held = true;
    h->tick(t0);
    h->release(step, t0);
    const std::int64_t samples = item->samples, nbytes = item->nbytes;
    nb::object batch = h->take(item);
    h->next_step = step + 1;
    h->delivered += 1;
    // Loader._on_batch(run, batch), with the counts the producer took
    const bool ok =
        set_int(d, k_step, step + 1) && add_int(d, k_delivered, 1) &&
        (samples < 0 || (add_int(d, k_samples, samples) && add_int(d, k_payload, nbytes)));
    gate_->held = false;
    if (!ok) return nullptr;  // with the exception set
    return batch.release().ptr();
  }

  static bool set_int(PyObject* d, PyObject* key, std::int64_t v) {
    PyObject* o = PyLong_FromLongLong(v);
    if (o == nullptr) return false;
    const int rc = PyDict_SetItem(d, key, o);
    Py_DECREF(o);
    return rc == 0;
  }

  static bool add_int(PyObject* d, PyObject* key, std::int64_t k) {
    PyObject* cur = PyDict_GetItemWithError(d, key);
    if (cur == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, key);
      return false;
    }
    PyObject* inc = PyLong_FromLongLong(k);
    if (inc == nullptr) return false;
    PyObject* sum = PyNumber_Add(cur, inc);
    Py_DECREF(inc);
    if (sum == nullptr) return false;
    const int rc = PyDict_SetItem(d, key, sum);
    Py_DECREF(sum);
    return rc == 0;
  }

  int traverse(visitproc visit, void* arg) const {
    for (const nb::object* o :
         {&loader_, &loader_dict_, &run_, &handoff_, &gate_obj_, &alarm_, &alarm_dict_})
      Py_VISIT(o->ptr());
    return 0;
  }

  void clear() {
    h_ = nullptr;  // the fast path takes the long way from now on
    gate_ = nullptr;
    nb::object objs[] = {std::move(loader_),    std::move(loader_dict_), std::move(run_),
                         std::move(handoff_),   std::move(gate_obj_),    std::move(alarm_),
                         std::move(alarm_dict_)};
    (void)objs;  // released here, after the members are empty
  }

  nb::object loader_, loader_dict_, run_, handoff_, gate_obj_, alarm_, alarm_dict_;
  Handoff* h_ = nullptr;
  Gate* gate_ = nullptr;
  double grace_ = 0.0;
  unsigned long owner_ = 0;  // the consuming thread's ident (0: none yet)
  bool has_owner_ = false;
  std::uint64_t forks_ = 0;
};

PyObject* pass_iternext(PyObject* self) {
  if (nb::inst_ready(nb::handle(self))) {
    PassIter* p = nb::inst_ptr<PassIter>(nb::handle(self));
    if (p->has_owner_) {
      PyObject* batch = p->ready_batch();
      if (batch != nullptr || PyErr_Occurred()) return batch;
    }
  }
  return PyObject_CallMethodNoArgs(self, k_slow_next);
}

// The garbage collector sees what both types hold: a stored exception's traceback
// reaches the frames of the pass, which hold the pass and so its Handoff (and an
// Epoch's failure announced to peers reaches the Epoch): cycles it must be able to
// break.
template <class T>
int traverse_of(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(nb::handle(self))) return 0;
  return nb::inst_ptr<T>(nb::handle(self))->traverse(visit, arg);
}

template <class T>
int clear_of(PyObject* self) {
  if (nb::inst_ready(nb::handle(self))) nb::inst_ptr<T>(nb::handle(self))->clear();
  return 0;
}

PyType_Slot pass_slots[] = {{Py_tp_iternext, reinterpret_cast<void*>(pass_iternext)},
                            {Py_tp_traverse, reinterpret_cast<void*>(traverse_of<PassIter>)},
                            {Py_tp_clear, reinterpret_cast<void*>(clear_of<PassIter>)},
                            {0, nullptr}};

PyType_Slot handoff_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(traverse_of<Handoff>)},
                               {Py_tp_clear, reinterpret_cast<void*>(clear_of<Handoff>)},
                               {0, nullptr}};

PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw nb::python_error();
  return o;  // kept for the life of the process
}

}  // namespace

void register_handoff(nb::module_& m) {
  static bool once = [] {
    pthread_atfork(nullptr, nullptr, forked_child);
    return true;
  }();
  (void)once;
  k_broken = intern("_broken");
  k_run = intern("_run");
  k_step = intern("_step");
  k_delivered = intern("_delivered");
  k_samples = intern("_samples");
  k_payload = intern("_payload");
  k_failure = intern("failure");
  k_next_test = intern("_next_test");
  k_slow_next = intern("_slow_next");

  m.def(
      "forks", [] { return g_forks.load(std::memory_order_relaxed); },
      "How many times this process's line has forked (a child's count is its parent's + 1).");
  m.def("monotonic", &now_s, "time.perf_counter() as the hand-over reads it (CLOCK_MONOTONIC).");

  nb::class_<Bell>(m, "Bell", "A doorbell for one waiting thread (pipeline/runner.py).")
      .def(nb::init<>())
      .def("ring", &Bell::ring, nb::arg("always") = false,
           "Wake the waiter if one waits (or always); True if one was waiting.")
      .def("wait", &Bell::wait, nb::arg("timeout"),
           "Wait (GIL released) for a ring, at most timeout seconds; a ring since the last "
           "wait returns at once.")
      .def_rw("waiting", &Bell::waiting)
      .def_rw("urgent", &Bell::urgent)
      .def_rw("wake_at", &Bell::wake_at)
      .def_ro("rings", &Bell::rings)
      .def_ro("waits", &Bell::waits);

  nb::class_<Handoff>(m, "Handoff", nb::type_slots(handoff_slots),
                      "Batches put by a pass's producer, by step (pipeline/runner.py).")
      .def(nb::init<std::int64_t, std::int64_t, std::int64_t, nb::object, nb::object>(),
           nb::arg("first"), nb::arg("last"), nb::arg("depth"), nb::arg("consumer_bell"),
           nb::arg("producer_bell"),
           "A pass's hand-over from step first to last; the producer keeps at most depth "
           "steps ahead; two Bell objects: the consumer's and the producer's.")
      .def("put", &Handoff::put, nb::arg("step"), nb::arg("ok"), nb::arg("value").none(),
           nb::arg("samples") = -1, nb::arg("nbytes") = 0,
           "Store step's result; True when it woke a consumer waiting for it.")
      .def(
          "pop",
          [](Handoff& h, std::int64_t step) -> nb::object {
            Item* item = h.find(step);
            if (item == nullptr) return nb::none();
            const bool ok = item->ok;
            return nb::make_tuple(ok, h.take(item));
          },
          nb::arg("step"), nb::sig("def pop(self, step: int) -> tuple[bool, typing.Any] | None"),
          "(ok, batch or exception) of step, taken out; None if not put.")
      .def("has", [](Handoff& h, std::int64_t step) { return h.find(step) != nullptr; })
      .def("tick", &Handoff::tick, nb::arg("t0"))
      .def("release", &Handoff::release, nb::arg("step"), nb::arg("t0"))
      .def("clear", &Handoff::clear, "Drop every batch held.")
      .def_prop_ro("held", &Handoff::held)
      .def_ro("last", &Handoff::last)
      .def_rw("next_step", &Handoff::next_step)
      .def_ro("taken", &Handoff::taken)
      .def_rw("delivered", &Handoff::delivered)
      .def_rw("period", &Handoff::period)
      .def_rw("taken_t", &Handoff::taken_t)
      .def_rw("closed", &Handoff::closed)
      .def_prop_ro("consumer_bell", [](const Handoff& h) { return h.bells_[0]; })
      .def_prop_ro("producer_bell", [](const Handoff& h) { return h.bells_[1]; });

  nb::class_<Gate>(m, "Gate", "The Loader's one-consumer flag (acquire(False) / release()).")
      .def(nb::init<>())
      .def("acquire", &Gate::acquire, nb::arg("blocking") = true)
      .def("release", &Gate::release)
      .def("locked", [](const Gate& g) { return g.held; });

  nb::class_<PassIter>(m, "PassIter", nb::type_slots(pass_slots),
                       "Base of pipeline.passes.Epoch: next() of a ready batch in C.")
      .def(nb::init<>())
      .def("_bind", &PassIter::bind, nb::arg("loader"), nb::arg("run"), nb::arg("handoff").none(),
           nb::arg("gate"), nb::arg("alarm").none(), nb::arg("grace"))
      .def_prop_rw(
          "_owner",
          [](const PassIter& p) -> nb::object {
            if (!p.has_owner_) return nb::none();
            return nb::int_(p.owner_);
          },
          [](PassIter& p, const nb::object& v) {
            p.has_owner_ = !v.is_none();
            p.owner_ = p.has_owner_ ? nb::cast<unsigned long>(v) : 0;
          })
      .def_prop_ro("_forks", [](const PassIter& p) { return p.forks_; })
      .def_prop_ro("_loader", [](const PassIter& p) { return p.loader_; })
      .def_prop_ro("_run", [](const PassIter& p) { return p.run_; })
      .def_prop_ro("_alarm", [](const PassIter& p) { return p.alarm_; })
      .def_prop_ro("_grace", [](const PassIter& p) { return p.grace_; });
}

}  // namespace feedline::py
