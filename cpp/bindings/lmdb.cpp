#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
void register_lmdb(nb::module_&) {}
}  // namespace feedline::py
