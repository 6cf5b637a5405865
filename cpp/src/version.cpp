// SPDX-License-Identifier: Apache-2.0
#include <feedline/version.hpp>

namespace feedline {
const char* version() noexcept { return "0.1.0"; }
}  // namespace feedline
