#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
void register_io(nb::module_&) {}
}  // namespace feedline::py
