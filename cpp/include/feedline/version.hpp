// SPDX-License-Identifier: Apache-2.0
/** @file version.hpp @brief Version of the native core. */
#pragma once
namespace feedline {
/// @brief The native core's version string (static storage; thread-safe).
const char* version() noexcept;
}  // namespace feedline
