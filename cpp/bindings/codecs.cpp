#include "bindings.hpp"

namespace nb = nanobind;

namespace feedline::py {
void register_codecs(nb::module_&) {}
}  // namespace feedline::py
