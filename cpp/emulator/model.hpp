// SPDX-License-Identifier: Apache-2.0
// The storage cost model of the FUSE emulator: a small parallel file system (striped
// servers with bounded concurrency and seek penalties, behind per-node and aggregate
// links) reduced to a deadline per request. Pure bookkeeping on a virtual clock; the
// caller sleeps until the deadline. Private to the emulator executable.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace feedline::emulator {

/// Parameters of the modelled storage. Defaults resemble the papers' GPFS/Lustre
/// setups scaled to one machine; docs/emulator.md explains each.
struct ModelParams {
  double latency_us = 300.0;              ///< fixed cost per request (RPC round trip + server)
  double node_mbps = 1000.0;              ///< client link of each node (1 MB = 1e6 bytes)
  double aggregate_mbps = 2000.0;         ///< shared backbone of all nodes
  double server_mbps = 800.0;             ///< media bandwidth of each storage server
  int servers = 4;                        ///< storage servers (OSTs / NSD servers)
  int stripe_count = 0;                   ///< servers a file is striped over (0 = all)
  std::uint64_t stripe_bytes = 1u << 20;  ///< stripe size
  double seek_us = 1000.0;        ///< paid per chunk that does not continue the previous one
  int server_concurrency = 4;     ///< requests a server serves at once; the rest queue
  std::uint64_t burst_bytes = 0;  ///< token-bucket depth of the node and aggregate links
};

/// What one request costs in the model.
struct Charge {
  double deadline = 0;       ///< modelled completion, seconds on the emulator clock
  double cost = 0;           ///< deadline - arrival
  std::uint32_t chunks = 0;  ///< stripe chunks the request touched
  std::uint32_t seeks = 0;   ///< chunks that paid the seek penalty
};

/// Token bucket on a virtual clock (GCRA form): a transfer of b bytes that arrives at
/// t completes at max(t, max(t, tat) + b/rate - depth/rate).
class Bucket {
 public:
  Bucket(double bytes_per_s, double depth_bytes)
      : rate_(bytes_per_s), tau_(depth_bytes / bytes_per_s) {}
  /// Reserve @p bytes arriving at @p now; return the completion time.
  double reserve(double now, double bytes);
  void reset() { tat_ = 0; }

 private:
  double rate_;
  double tau_;
  double tat_ = 0;
};

/// The model. Thread-safe: charge() takes an internal lock (a few hundred ns).
class Model {
 public:
  Model(const ModelParams& params, int nodes);

  /// Charge a read of @p length bytes at @p offset of file @p file (an id interned by
  /// the caller; @p file_hash chooses the first server of its stripe) from @p node,
  /// arriving at @p now. A request of 0 bytes pays the latency only.
  Charge charge(int node, std::uint32_t file, std::uint64_t file_hash, std::uint64_t offset,
                std::uint64_t length, double now);

  /// Forget queues, buckets and stream positions (the next request starts idle).
  void reset();

  const ModelParams& params() const { return p_; }

 private:
  struct Range {
    std::uint64_t lo = 0, hi = 0;
  };
  struct Server {
    std::vector<double> slot_free;                    // per concurrent slot
    std::unordered_map<std::uint32_t, Range> stream;  // last chunk per file, object space
  };

  ModelParams p_;
  int stripe_count_;
  std::mutex mu_;
  std::vector<Bucket> node_links_;
  Bucket aggregate_;
  std::vector<Server> servers_;
};

/// Validate @p p; return an empty string or a message naming the bad parameter.
std::string validate(const ModelParams& p);

}  // namespace feedline::emulator
