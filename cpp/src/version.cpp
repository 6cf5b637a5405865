// SPDX-License-Identifier: Apache-2.0
#include <feedline/version.hpp>

#ifndef FEEDLINE_VERSION
#error "FEEDLINE_VERSION is defined by CMake from pyproject.toml"
#endif

namespace feedline {
const char* version() noexcept { return FEEDLINE_VERSION; }
}  // namespace feedline
