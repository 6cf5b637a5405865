// SPDX-License-Identifier: Apache-2.0
// Cost model: completion = arrival + latency + the slowest of (server chunks, node link,
// aggregate link), all reserved from the arrival time. The stages overlap because a
// parallel file system pipelines them (servers stream while the network carries); a
// serial sum would halve single-stream bandwidth, which real clients do not see.
#include "model.hpp"

#include <algorithm>

namespace feedline::emulator {

double Bucket::reserve(double now, double bytes) {
  const double start = std::max(now, tat_);
  tat_ = start + bytes / rate_;
  return std::max(now, tat_ - tau_);
}

Model::Model(const ModelParams& params, int nodes)
    : p_(params),
      stripe_count_(params.stripe_count <= 0 ? params.servers
                                             : std::min(params.stripe_count, params.servers)),
      aggregate_(params.aggregate_mbps * 1e6, static_cast<double>(params.burst_bytes)) {
  node_links_.reserve(static_cast<std::size_t>(nodes));
  for (int i = 0; i < nodes; ++i)
    node_links_.emplace_back(p_.node_mbps * 1e6, static_cast<double>(p_.burst_bytes));
  servers_.resize(static_cast<std::size_t>(p_.servers));
  for (auto& s : servers_) s.slot_free.assign(static_cast<std::size_t>(p_.server_concurrency), 0.0);
}

void Model::reset() {
  std::lock_guard lock(mu_);
  for (auto& b : node_links_) b.reset();
  aggregate_.reset();
  for (auto& s : servers_) {
    std::fill(s.slot_free.begin(), s.slot_free.end(), 0.0);
    s.stream.clear();
  }
}

Charge Model::charge(int node, std::uint32_t file, std::uint64_t file_hash, std::uint64_t offset,
                     std::uint64_t length, double now) {
  Charge c;
  const double latency = p_.latency_us * 1e-6;
  const double seek = p_.seek_us * 1e-6;
  const double server_rate = p_.server_mbps * 1e6;
  const std::uint64_t stripe = p_.stripe_bytes;
  const auto first_server =
      static_cast<std::uint64_t>(file_hash % static_cast<std::uint64_t>(p_.servers));
  const auto count = static_cast<std::uint64_t>(stripe_count_);

  std::lock_guard lock(mu_);
  double done = now;
  std::uint64_t pos = offset;
  const std::uint64_t end = offset + length;
  while (pos < end) {
    // Stripe k of the file lives on server (first + k) % count at object offset
    // (k / count) * stripe: a server stores its stripes of a file back to back, so a
    // sequential reader is sequential on every server.
    const std::uint64_t k = pos / stripe;
    const std::uint64_t chunk_end = std::min(end, (k + 1) * stripe);
    const std::uint64_t len = chunk_end - pos;
    auto& srv = servers_[static_cast<std::size_t>((first_server + k % count) %
                                                  static_cast<std::uint64_t>(p_.servers))];
    const std::uint64_t obj_lo = (k / count) * stripe + pos % stripe;
    const std::uint64_t obj_hi = obj_lo + len;

    // Sequential = touches the previous chunk of this file on this server (either side,
    // so two requests the kernel issued in order but our threads picked up swapped do
    // not both seek). The remembered range keeps at most one stripe behind its head so
    // that a later random read into old data still seeks.
    bool sequential = false;
    auto it = srv.stream.find(file);
    if (it != srv.stream.end() && obj_lo <= it->second.hi && obj_hi >= it->second.lo) {
      sequential = true;
      Range& r = it->second;
      r.hi = std::max(r.hi, obj_hi);
      r.lo = std::max(std::min(r.lo, obj_lo), r.hi > stripe ? r.hi - stripe : 0);
    } else {
      srv.stream[file] = Range{obj_lo, obj_hi};
    }

    auto slot = std::min_element(srv.slot_free.begin(), srv.slot_free.end());
    const double start = std::max(now, *slot);
    const double service = (sequential ? 0.0 : seek) + static_cast<double>(len) / server_rate;
    *slot = start + service;
    done = std::max(done, *slot);
    ++c.chunks;
    if (!sequential) ++c.seeks;
    pos = chunk_end;
  }
  if (length > 0) {
    const auto bytes = static_cast<double>(length);
    done = std::max(done, node_links_[static_cast<std::size_t>(node)].reserve(now, bytes));
    done = std::max(done, aggregate_.reserve(now, bytes));
  }
  c.deadline = done + latency;
  c.cost = c.deadline - now;
  return c;
}

std::string validate(const ModelParams& p) {
  if (!(p.latency_us >= 0)) return "latency-us must be >= 0";
  if (!(p.node_mbps > 0)) return "node-mbps must be > 0";
  if (!(p.aggregate_mbps > 0)) return "aggregate-mbps must be > 0";
  if (!(p.server_mbps > 0)) return "server-mbps must be > 0";
  if (p.servers < 1 || p.servers > 4096) return "servers must be in [1, 4096]";
  if (p.stripe_count < 0) return "stripe-count must be >= 0 (0 = all servers)";
  if (p.stripe_bytes < 4096 || p.stripe_bytes % 4096 != 0)
    return "stripe size must be a positive multiple of 4 KiB";
  if (!(p.seek_us >= 0)) return "seek-us must be >= 0";
  if (p.server_concurrency < 1 || p.server_concurrency > 4096)
    return "server-concurrency must be in [1, 4096]";
  return {};
}

}  // namespace feedline::emulator
