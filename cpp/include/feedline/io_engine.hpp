// SPDX-License-Identifier: Apache-2.0
/**
 * @file io_engine.hpp
 * @brief The native I/O engine: a pool of threads that executes lists of extents into
 *        caller-provided buffers with buffered `pread`, `O_DIRECT` or `mmap` + `memcpy`.
 *
 * A submission is a list of extents (file, offset, length), each with a destination
 * offset in one caller buffer. Extents longer than `chunk_bytes` are split into chunks;
 * chunks (or runs of small extents) form tasks that the threads take in submission
 * order, so one large extent is read by all threads at once and many small ones are
 * batched instead of paying a queue operation each. Every submission returns an
 * IoFuture whose result is that submission's statistics.
 */
#pragma once

#include <feedline/extent.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace feedline {

namespace detail {
struct Submission;
struct EngineState;
}  // namespace detail

/// @brief How the engine moves bytes from a file into a buffer.
enum class IoMethod : int {
  pread,         ///< buffered `pread(2)` through the page cache
  odirect,       ///< `O_DIRECT` reads into aligned bounce buffers (or straight into the
                 ///< destination when it is aligned); buffered where the file system refuses
  mmap,          ///< `memcpy` from a read-only mapping: the reactive-paging baseline
  pread_random,  ///< buffered `pread(2)` with the kernel's read-ahead off
                 ///< (`POSIX_FADV_RANDOM`): large scattered reads (tiles) that read-ahead
                 ///< past their ends would only waste bandwidth on
};

/**
 * @brief Parse "pread", "odirect", "mmap" or "pread-random".
 * @throws std::invalid_argument for any other name.
 */
IoMethod parse_io_method(std::string_view name);

/// @brief The name parse_io_method() accepts for @p method (static storage).
const char* to_string(IoMethod method) noexcept;

/// @brief How a file of the engine's table is currently read.
enum class FileMode : int {
  unopened,  ///< not opened yet (files are opened on first use)
  buffered,  ///< buffered descriptor (method pread)
  direct,    ///< `O_DIRECT` descriptor in use
  fallback,  ///< method odirect, but the file system refused `O_DIRECT` (EINVAL at open
             ///< or at the first read): read buffered, same bytes
  mapped,    ///< mapped read-only (method mmap)
};

/// @brief "unopened", "buffered", "direct", "fallback" or "mapped" (static storage).
const char* to_string(FileMode mode) noexcept;

/// @brief Engine configuration (see feedline.defaults for the Python-side defaults).
struct IoOptions {
  unsigned threads = 4;                           ///< I/O threads, >= 1
  IoMethod method = IoMethod::pread;              ///< how bytes are read
  std::size_t chunk_bytes = 8u << 20;             ///< largest single read; >= 4096
  std::size_t alignment = 0;                      ///< O_DIRECT alignment; 0: ask the file
                                                  ///< system (statx DIOALIGN), 4096 if unknown
  unsigned max_retries = 3;                       ///< retries of a transient error (EIO...)
  std::chrono::microseconds retry_backoff{1000};  ///< first back-off, doubled per retry
  bool stage = false;  ///< odirect: read every extent through the thread's huge-page staging
                       ///< buffer (4 MiB at most) and copy it out, for destinations in
                       ///< 4 KiB-page shared memory, where one large read would otherwise
                       ///< become many device (or FUSE) requests of a few hundred pages each
};

/**
 * @brief Counters of one submission, or of the engine since construction.
 *
 * For the engine, counters cover finished tasks, except `retries`, which counts retries
 * as they happen; `wall_s` is the time during which at least one submission was in
 * flight (overlapping submissions are not double counted).
 */
struct IoStats {
  std::uint64_t bytes = 0;          ///< payload bytes delivered into buffers
  std::uint64_t storage_bytes = 0;  ///< bytes asked of storage (O_DIRECT rounds each read
                                    ///< out to the alignment; mmap: bytes copied)
  std::uint64_t bounced_bytes = 0;  ///< O_DIRECT bytes copied out of a bounce buffer (the
                                    ///< read was not aligned where it lands, or `stage`)
  std::uint64_t ops = 0;            ///< read system calls issued, retries included
  std::uint64_t extents = 0;        ///< extents executed
  std::uint64_t tasks = 0;          ///< tasks (chunks or runs of small extents) executed
  std::uint64_t retries = 0;        ///< transient errors retried
  std::uint64_t minor_faults = 0;   ///< page faults of the I/O threads served from memory
  std::uint64_t major_faults = 0;   ///< page faults that waited for storage (mmap paging)
  std::uint64_t submissions = 0;    ///< submissions finished (1 for a submission)
  double busy_s = 0;                ///< thread-seconds spent executing tasks
  double wall_s = 0;                ///< seconds from submission to completion
};

/**
 * @brief Completion handle of one submission.
 *
 * Copyable; all copies share the submission. Thread-safe: any thread may wait. The
 * result stays available after the engine is closed or destroyed.
 */
class IoFuture {
 public:
  IoFuture() = default;

  /// @brief False for a default-constructed future.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

  /// @brief True once every task of the submission finished (or was cancelled).
  [[nodiscard]] bool done() const;

  /**
   * @brief Wait at most @p timeout.
   * @return done()
   */
  bool wait_for(std::chrono::nanoseconds timeout) const;

  /// @brief Wait until done().
  void wait() const;

  /**
   * @brief Wait, then return the submission's statistics.
   *
   * May be called repeatedly.
   * @throws CorruptData an extent ends past the end of its file
   * @throws StorageFailure an open or read failed persistently (after retries)
   * @throws std::runtime_error the engine was closed before the submission ran
   */
  IoStats get() const;

 private:
  friend class IoEngine;
  explicit IoFuture(std::shared_ptr<detail::Submission> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::Submission> state_;
};

/**
 * @brief A pool of I/O threads over a fixed table of files.
 *
 * Files are named by their position in the table (Extent::file_id), opened on first
 * use — once per engine, with a separate `O_DIRECT` descriptor for method odirect — and
 * closed by close() or the destructor.
 *
 * Thread-safety: submit(), read(), stats(), file_mode(), evict() and close() may be
 * called concurrently from any thread. Submissions run in FIFO order of their tasks.
 *
 * Lifetime: the caller keeps each destination buffer alive and untouched until the
 * submission's future is done. close() (and the destructor) cancels tasks not yet
 * started — their futures throw std::runtime_error — waits for running tasks, joins
 * the threads and closes the files; after it returns no thread writes to any buffer.
 * Destinations of different extents must not overlap. Files must not shrink while
 * method mmap maps them (the kernel would raise SIGBUS).
 */
class IoEngine {
 public:
  /**
   * @brief Start the threads; no file is opened yet.
   * @param paths the file table
   * @param options threads, method, chunk size, alignment, retry policy
   * @throws std::invalid_argument for threads == 0, chunk_bytes < 4096 or an alignment
   *         that is not a power of two
   */
  explicit IoEngine(std::vector<std::string> paths, IoOptions options = {});

  /// @brief close().
  ~IoEngine();

  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;
  IoEngine(IoEngine&&) = delete;
  IoEngine& operator=(IoEngine&&) = delete;

  /**
   * @brief Queue @p extents for reading into @p buffer and return at once.
   *
   * The extents and destination offsets are copied; @p buffer is not.
   * @param extents byte ranges of files of the table
   * @param buffer destination base address (may be null when every length is 0)
   * @param buffer_size bytes writable at @p buffer
   * @param dest_offsets where each extent lands in @p buffer; empty: back to back in
   *        extent order
   * @throws std::out_of_range a file_id outside the table
   * @throws std::invalid_argument negative offset or length, a destination outside the
   *         buffer, mismatched sizes, or a closed engine
   */
  IoFuture submit(std::span<const Extent> extents, void* buffer, std::size_t buffer_size,
                  std::span<const std::int64_t> dest_offsets = {});

  /// @brief submit(), then wait: the statistics or the submission's error.
  IoStats read(std::span<const Extent> extents, void* buffer, std::size_t buffer_size,
               std::span<const std::int64_t> dest_offsets = {});

  /// @brief Cumulative statistics (a consistent-enough snapshot; see IoStats).
  [[nodiscard]] IoStats stats() const;

  /// @brief The options the engine runs with.
  [[nodiscard]] const IoOptions& options() const noexcept;

  /// @brief Number of files in the table.
  [[nodiscard]] std::size_t num_files() const noexcept;

  /// @brief Path of @p file_id. @throws std::out_of_range
  [[nodiscard]] const std::string& path(std::int32_t file_id) const;

  /// @brief How @p file_id is read right now. @throws std::out_of_range
  [[nodiscard]] FileMode file_mode(std::int32_t file_id) const;

  /**
   * @brief Drop every file of the table from the page cache (evict_page_cache()).
   *
   * Pages the engine maps itself (method mmap) stay resident until close().
   */
  void evict() const;

  /// @brief Cancel queued tasks, wait for running ones, join, close files. Idempotent.
  void close() noexcept;

  /**
   * @brief Like close(), but without waiting for running tasks: the threads are
   *        detached and finish their current read in the background (a read stalled on
   *        a hung file system). Their destinations are written until those reads end:
   *        the caller must keep the buffers alive and never reuse them. The files close
   *        when the last thread ends. Idempotent; close() after it does nothing.
   */
  void abandon() noexcept;

  /// @brief True after close().
  [[nodiscard]] bool closed() const noexcept;

 private:
  void stop(bool join) noexcept;
  std::shared_ptr<detail::EngineState> state_;
};

/**
 * @brief Drop the clean cached pages of @p path (after writing back dirty ones) with
 *        `posix_fadvise(POSIX_FADV_DONTNEED)`: makes the next read of it cold.
 *
 * Pages that some process maps stay resident. Thread-safe.
 * @throws StorageFailure the file cannot be opened or the advice is refused
 */
void evict_page_cache(const std::string& path);

/**
 * @brief Bytes of @p path resident in the page cache right now (`mincore(2)`).
 * @throws StorageFailure the file cannot be opened or mapped
 */
std::uint64_t resident_bytes(const std::string& path);

}  // namespace feedline
