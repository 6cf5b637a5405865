// SPDX-License-Identifier: Apache-2.0
/**
 * @file io_files.hpp
 * @brief Private: the engine's file table — paths opened lazily, once, into a buffered
 *        descriptor, an `O_DIRECT` descriptor and/or a read-only mapping.
 */
#pragma once

#include <feedline/io_engine.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace feedline::detail {

/**
 * @brief Lazily opened files, named by position.
 *
 * Accessors are thread-safe: the first caller opens under a per-file mutex, later
 * callers read an atomic. close_all() must not race with accessors (the engine calls it
 * after joining its threads).
 */
class FileTable {
 public:
  /// @brief An `O_DIRECT` descriptor and the alignment its reads need.
  struct Direct {
    int fd = -1;
    std::size_t offset_align = 4096;  ///< file offsets and lengths
    std::size_t mem_align = 4096;     ///< buffer addresses
  };
  /// @brief A read-only mapping of a whole file (base may be null for an empty file).
  struct Mapping {
    const unsigned char* base = nullptr;
    std::size_t size = 0;
  };

  /// @param alignment_override nonzero: use it for O_DIRECT instead of asking statx
  FileTable(std::vector<std::string> paths, std::size_t alignment_override);
  ~FileTable();
  FileTable(const FileTable&) = delete;
  FileTable& operator=(const FileTable&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return paths_.size(); }
  [[nodiscard]] const std::string& path(std::int32_t id) const { return paths_.at(check(id)); }

  /// @brief The buffered descriptor. @throws StorageFailure when open fails
  int buffered_fd(std::int32_t id);

  /// @brief Open buffered descriptors with `POSIX_FADV_RANDOM` (no kernel read-ahead);
  ///        call before the first read.
  void set_random_access(bool on) noexcept { random_access_ = on; }

  /**
   * @brief The `O_DIRECT` descriptor, or fd == -1 when the file system refuses
   *        `O_DIRECT` for this file (EINVAL at open, or refuse_direct() was called).
   * @throws StorageFailure when open fails for another reason
   */
  Direct direct(std::int32_t id);

  /// @brief The file system refused an `O_DIRECT` read before any succeeded.
  void refuse_direct(std::int32_t id) noexcept;

  /// @brief An `O_DIRECT` read succeeded: later EINVALs are real errors.
  void confirm_direct(std::int32_t id) noexcept;

  /// @brief Whether an `O_DIRECT` read of @p id has succeeded.
  [[nodiscard]] bool direct_confirmed(std::int32_t id) const noexcept;

  /// @brief The whole file mapped read-only. @throws StorageFailure
  Mapping mapping(std::int32_t id);

  /// @brief How the file is read now.
  [[nodiscard]] FileMode mode(std::int32_t id) const;

  /// @brief Close descriptors and unmap. Idempotent.
  void close_all() noexcept;

 private:
  enum : int { kUnknown = 0, kConfirmed = 1, kRefused = 2 };
  struct Slot {
    std::mutex mutex;
    std::atomic<int> fd{-1};
    std::atomic<int> dfd{-1};
    std::atomic<int> direct_state{kUnknown};
    std::size_t offset_align = 4096;
    std::size_t mem_align = 4096;
    std::atomic<bool> mapped{false};
    const unsigned char* map_base = nullptr;
    std::size_t map_size = 0;
  };
  std::size_t check(std::int32_t id) const;

  std::vector<std::string> paths_;
  std::size_t alignment_override_;
  bool random_access_ = false;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace feedline::detail
