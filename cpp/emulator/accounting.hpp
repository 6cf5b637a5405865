// SPDX-License-Identifier: Apache-2.0
// The emulator's own accounting: totals per node (always complete) and a bounded log of
// the most recent requests, both rendered as JSON for the control files. Private to the
// emulator executable.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace feedline::emulator {

/// One served read.
struct RequestRecord {
  double arrival = 0;   ///< seconds on the emulator clock when the daemon got it
  double modelled = 0;  ///< modelled cost (deadline - arrival)
  double service = 0;   ///< actual arrival -> reply time
  std::uint64_t offset = 0;
  std::uint32_t size = 0;  ///< bytes returned
  std::uint32_t file = 0;  ///< interned path id
  std::uint16_t node = 0;
  std::uint16_t seeks = 0;
  bool direct = false;  ///< from an O_DIRECT open
};

/// Sums over requests.
struct Totals {
  std::uint64_t requests = 0, bytes = 0, seeks = 0, direct_requests = 0, underpaid = 0;
  double modelled_s = 0, service_s = 0, overrun_s = 0, max_overrun_s = 0;
  void add(const RequestRecord& r);
};

/// Thread-safe accounting.
class Accounting {
 public:
  Accounting(int nodes, std::size_t log_capacity);

  void record(const RequestRecord& r);
  void reset();

  /// Intern @p path (relative to the source directory); ids are stable for the run.
  std::uint32_t intern(const std::string& path);

  /// Totals as a JSON object body fragment: "per_node": [...], "total": {...}, ...
  std::string totals_json() const;
  /// The request log in arrival order, one JSON object per line.
  std::string requests_jsonl() const;

 private:
  mutable std::mutex mu_;
  std::vector<Totals> per_node_;
  std::vector<RequestRecord> ring_;
  std::size_t capacity_;
  std::uint64_t seen_ = 0;  // records since the last reset
  mutable std::mutex files_mu_;
  std::vector<std::string> files_;
  std::unordered_map<std::string, std::uint32_t> file_ids_;
};

/// @p s as a JSON string literal, quotes included.
std::string json_string(const std::string& s);

}  // namespace feedline::emulator
