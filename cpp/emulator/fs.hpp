// SPDX-License-Identifier: Apache-2.0
// The emulator's file system: one FUSE mount whose root lists node0 ... node{M-1}, each a
// read-only view of the source directory with its own inode numbers (so the kernel keeps
// a separate page cache per emulated node), plus three control files. Private to the
// emulator executable.
#pragma once

#define FUSE_USE_VERSION 312  // FUSE_MAKE_VERSION(3, 12): fuse_loop_config API
#include <fuse_lowlevel.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "accounting.hpp"
#include "model.hpp"

namespace feedline::emulator {

/// Predicts how long a reply's copy into the kernel takes, so that a worker can wake
/// that much before a deadline and the client sees the data at the deadline. Uses the
/// fastest per-byte cost among the last 128 large replies, and nothing until 8 were
/// seen: a conservative guess (a preempted copy only makes a sample slower), so a reply
/// almost never completes before its deadline.
class CopyCost {
 public:
  /// Record a reply of @p bytes that took @p seconds.
  void record(std::size_t bytes, double seconds);
  /// Predicted seconds for a reply of @p bytes (0 until enough large replies were seen).
  double predict(std::size_t bytes) const;

 private:
  static constexpr std::size_t kWindow = 128;
  static constexpr std::size_t kMinSamples = 8;
  static constexpr std::size_t kMinBytes = 64 * 1024;  // smaller replies: fixed costs dominate
  mutable std::mutex mu_;
  double per_byte_[kWindow] = {};
  std::size_t count_ = 0;
};

/// An open file: a view of a source file, or a snapshot of a control file's text.
struct Handle;

/// An injected fault (control command ``fault KIND MATCH [count=N] [skip=K] [seconds=S]``):
/// reads of files whose relative path contains MATCH ("*": all), after letting @p skip
/// of them through, fail @p count times (0: always).
struct Fault {
  std::string kind;   ///< eio, estale, enoent, eintr (reply that errno), short, stall
  std::string match;  ///< substring of the relative path; empty: every file
  long count = 0;
  long skip = 0;
  double seconds = 0;  ///< stall length (default 45 s); "fault clear" ends stalls
  long seen = 0, fired = 0;
};

/// What a read must do.
struct FaultAction {
  int err = 0;           ///< reply this errno instead of data
  bool shorten = false;  ///< return half of the bytes
  double stall_s = 0;    ///< wait this long first
};

/// Everything the command line sets.
struct Options {
  std::string src;
  std::string mountpoint;
  int nodes = 1;
  ModelParams model;
  std::uint32_t readahead_kib = 1024;    ///< client read-ahead per node view (0 = kernel's)
  std::uint32_t max_request_kib = 1024;  ///< largest read request the kernel may send
  std::size_t log_requests = 65536;      ///< request log capacity (0 = totals only)
  int max_threads = 128;                 ///< FUSE worker threads (each sleeps to a deadline)
  double path_us = -1;                   ///< kernel path reader<->daemon; < 0: calibrate
  bool debug = false;
};

/// The file system state shared by all FUSE worker threads.
///
/// Lifetime: constructed before the session, destroyed after the loop has returned.
/// Thread safety: every member function may be called from any worker thread.
class Filesystem {
 public:
  /// Open the source directory. Throws std::runtime_error with a message on failure.
  explicit Filesystem(Options opts);
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  /// The low-level operation table; userdata must be this object.
  static const fuse_lowlevel_ops& operations();

  void set_session(fuse_session* se) { session_ = se; }
  const Options& options() const { return opts_; }
  /// Read-ahead actually configured (KiB), or -1 when it could not be set.
  void set_effective_readahead(int kib) { effective_readahead_kib_ = kib; }
  /// The kernel path between a reader and the daemon: part of the modelled latency that
  /// the client pays outside the daemon, so the daemon replies that much earlier and
  /// adds it to the service time it reports. Modelled as @p fixed seconds plus
  /// @p per_byte seconds per requested byte, at most @p cap. Call before serving reads.
  void set_path(double fixed, double per_byte, double cap) {
    path_fixed_ = fixed;
    path_per_byte_ = per_byte;
    path_cap_ = cap;
  }
  /// The path of a request of @p bytes, seconds.
  double path(std::size_t bytes) const {
    return std::min(path_cap_.load(),
                    path_fixed_.load() + path_per_byte_.load() * static_cast<double>(bytes));
  }

  // Called by the operation callbacks (fs.cpp); public only for that reason.
  struct Inode {
    int node = -1;      // -1 for the root and control files
    std::string rel;    // path relative to the source ("" = its root)
    ino_t src_ino = 0;  // the source file's inode when looked up
    std::uint64_t nlookup = 0;
  };
  /// Seconds since start on CLOCK_MONOTONIC (the model's clock).
  double now() const;
  /// Absolute CLOCK_MONOTONIC time of model time @p t.
  timespec to_timespec(double t) const;
  bool inode(fuse_ino_t ino, Inode& out);
  fuse_ino_t intern(int node, const std::string& rel, ino_t src_ino);
  void forget(fuse_ino_t ino, std::uint64_t n);
  std::string stats_json();
  /// Apply one control command; return 0 or an errno.
  int control(const std::string& line);
  int drop_caches(int node);
  /// The fault a read of @p rel meets now (counts it).
  FaultAction fault_for(const std::string& rel);
  /// Sleep @p seconds, or until "fault clear".
  void stall(double seconds);
  std::uint64_t faults_fired() {
    std::lock_guard lock(faults_mu_);
    return faults_fired_;
  }

  /// Open handles by id (the fh the kernel passes back). Shared ownership: a release
  /// that arrives while a read of the same handle is still being served (seen under
  /// load) only drops the table's reference; the read finishes with its own.
  std::uint64_t add_handle(std::shared_ptr<Handle> h);
  std::shared_ptr<Handle> handle(std::uint64_t id);
  void drop_handle(std::uint64_t id);

  int src_fd() const { return src_fd_; }
  /// Wall-clock start of this daemon: the times of the synthetic files, so a client can
  /// tell this mount from an earlier one at the same place (device numbers are reused).
  const timespec& started() const { return started_; }
  Model model;
  Accounting accounting;
  CopyCost copy_cost;
  /// Reads between the start of their reply and their accounting record. A client may
  /// open the stats right after its read returned; the snapshot waits for these so that
  /// it includes every read the client has seen completed.
  std::atomic<int> replying{0};

 private:
  Options opts_;
  int src_fd_ = -1;
  fuse_session* session_ = nullptr;
  timespec t0_{};
  timespec started_{};
  int effective_readahead_kib_ = -1;
  // Written once by the start-up helper; reads that arrive while it measures see 0.
  std::atomic<double> path_fixed_{0.0}, path_per_byte_{0.0}, path_cap_{0.0};
  int add_fault(const std::string& line);
  std::mutex faults_mu_;
  std::condition_variable stall_cv_;
  std::vector<Fault> faults_;
  std::uint64_t stall_epoch_ = 0;
  std::uint64_t faults_fired_ = 0;
  std::mutex handles_mu_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Handle>> handles_;
  std::uint64_t next_handle_ = 1;
  std::mutex inodes_mu_;
  std::unordered_map<fuse_ino_t, Inode> inodes_;
  std::unordered_map<std::string, fuse_ino_t> by_key_;
  fuse_ino_t next_ino_;
};

/// Inode numbers of the fixed entries.
inline constexpr fuse_ino_t kRootIno = FUSE_ROOT_ID;
inline constexpr fuse_ino_t kStatsIno = 2;
inline constexpr fuse_ino_t kRequestsIno = 3;
inline constexpr fuse_ino_t kControlIno = 4;
inline constexpr fuse_ino_t kFirstNodeIno = 16;
inline constexpr const char* kStatsName = ".feedline-stats";
inline constexpr const char* kRequestsName = ".feedline-requests";
inline constexpr const char* kControlName = ".feedline-control";

}  // namespace feedline::emulator
