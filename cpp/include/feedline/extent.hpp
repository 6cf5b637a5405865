// SPDX-License-Identifier: Apache-2.0
/**
 * @file extent.hpp
 * @brief The byte range every layer of feedline speaks: which file, where, how long.
 */
#pragma once

#include <cstdint>

namespace feedline {

/**
 * @brief A contiguous byte range of one dataset file.
 *
 * Plain data: copyable, no invariants beyond offset >= 0 and length >= 0, which the
 * producers (indexers, planner) guarantee and the engine re-checks.
 */
struct Extent {
  std::int32_t file_id;  ///< index into the dataset's file list
  std::int64_t offset;   ///< byte offset in that file
  std::int64_t length;   ///< number of bytes
};

}  // namespace feedline
