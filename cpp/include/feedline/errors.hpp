// SPDX-License-Identifier: Apache-2.0
/**
 * @file errors.hpp
 * @brief Typed failures raised by the native core; the bindings translate them to
 *        feedline.CorruptDataError, feedline.StorageError and
 *        feedline.UnsupportedFormatError.
 */
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace feedline {

/// @brief The file's bytes contradict its format (truncated, out of range, cyclic...).
class CorruptData : public std::runtime_error {
 public:
  CorruptData(std::string path, std::uint64_t offset, std::string reason)
      : std::runtime_error(path + " @ " + std::to_string(offset) + ": " + reason),
        path(std::move(path)), offset(offset), reason(std::move(reason)) {}
  std::string path;
  std::uint64_t offset;
  std::string reason;
};

/// @brief A valid file that uses a feature feedline does not read (e.g. LMDB DUPSORT).
class Unsupported : public std::runtime_error {
 public:
  Unsupported(std::string path, std::string reason)
      : std::runtime_error(path + ": " + reason), path(std::move(path)), reason(std::move(reason)) {
  }
  std::string path;
  std::string reason;
};

/// @brief A persistent I/O failure (after retries): file, offset and errno.
class StorageFailure : public std::runtime_error {
 public:
  StorageFailure(std::string path, std::uint64_t offset, int err, const std::string& what)
      : std::runtime_error(path + " @ " + std::to_string(offset) + ": " + what),
        path(std::move(path)), offset(offset), err(err) {}
  std::string path;
  std::uint64_t offset;
  int err;
};

}  // namespace feedline
