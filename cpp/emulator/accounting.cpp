// SPDX-License-Identifier: Apache-2.0
// Accounting: a ring buffer keeps the last N requests so memory stays bounded on long
// runs, while per-node totals count every request since the last reset.
#include "accounting.hpp"

#include <algorithm>
#include <cstdio>

namespace feedline::emulator {

void Totals::add(const RequestRecord& r) {
  ++requests;
  bytes += r.size;
  seeks += r.seeks;
  direct_requests += r.direct ? 1 : 0;
  modelled_s += r.modelled;
  service_s += r.service;
  const double over = r.service - r.modelled;
  if (over < 0) ++underpaid;
  overrun_s += std::max(0.0, over);
  max_overrun_s = std::max(max_overrun_s, over);
}

Accounting::Accounting(int nodes, std::size_t log_capacity)
    : per_node_(static_cast<std::size_t>(nodes)), capacity_(log_capacity) {
  ring_.reserve(std::min<std::size_t>(capacity_, 4096));
}

void Accounting::record(const RequestRecord& r) {
  std::lock_guard lock(mu_);
  per_node_[r.node].add(r);
  if (capacity_ > 0) {
    if (ring_.size() < capacity_) ring_.push_back(r);
    else ring_[seen_ % capacity_] = r;
  }
  ++seen_;
}

void Accounting::reset() {
  std::lock_guard lock(mu_);
  for (auto& t : per_node_) t = Totals{};
  ring_.clear();
  seen_ = 0;
}

std::uint32_t Accounting::intern(const std::string& path) {
  std::lock_guard lock(files_mu_);
  auto [it, added] = file_ids_.try_emplace(path, static_cast<std::uint32_t>(files_.size()));
  if (added) files_.push_back(path);
  return it->second;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);  // UTF-8 passes through; other bytes are rare in paths
        }
    }
  }
  return out + "\"";
}

namespace {

std::string totals_object(const Totals& t, int node) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{%s\"requests\": %llu, \"bytes\": %llu, \"seeks\": %llu, "
                "\"direct_requests\": %llu, \"modelled_s\": %.9f, \"service_s\": %.9f, "
                "\"overrun_s\": %.9f, \"max_overrun_s\": %.9f, \"underpaid\": %llu}",
                node >= 0 ? ("\"node\": " + std::to_string(node) + ", ").c_str() : "",
                static_cast<unsigned long long>(t.requests),
                static_cast<unsigned long long>(t.bytes), static_cast<unsigned long long>(t.seeks),
                static_cast<unsigned long long>(t.direct_requests), t.modelled_s, t.service_s,
                t.overrun_s, t.requests ? t.max_overrun_s : 0.0,
                static_cast<unsigned long long>(t.underpaid));
  return buf;
}

}  // namespace

std::string Accounting::totals_json() const {
  std::lock_guard lock(mu_);
  Totals all;
  std::string out = "\"per_node\": [";
  for (std::size_t i = 0; i < per_node_.size(); ++i) {
    const Totals& t = per_node_[i];
    if (i) out += ", ";
    out += totals_object(t, static_cast<int>(i));
    all.requests += t.requests;
    all.bytes += t.bytes;
    all.seeks += t.seeks;
    all.direct_requests += t.direct_requests;
    all.underpaid += t.underpaid;
    all.modelled_s += t.modelled_s;
    all.service_s += t.service_s;
    all.overrun_s += t.overrun_s;
    if (t.requests) all.max_overrun_s = std::max(all.max_overrun_s, t.max_overrun_s);
  }
  out += "], \"total\": " + totals_object(all, -1);
  const std::uint64_t logged = std::min<std::uint64_t>(seen_, capacity_);
  out += ", \"requests_logged\": " + std::to_string(logged) +
         ", \"requests_dropped\": " + std::to_string(seen_ - logged);
  return out;
}

std::string Accounting::requests_jsonl() const {
  std::vector<RequestRecord> recs;
  {
    std::lock_guard lock(mu_);
    recs.reserve(ring_.size());
    if (seen_ <= capacity_) {
      recs = ring_;
    } else {  // oldest is the slot the next record would overwrite
      const std::size_t head = seen_ % capacity_;
      recs.insert(recs.end(), ring_.begin() + static_cast<std::ptrdiff_t>(head), ring_.end());
      recs.insert(recs.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(head));
    }
  }
  // Completion order is not arrival order (a worker may be preempted between its reply
  // and its record); the log reads in arrival order.
  std::stable_sort(recs.begin(), recs.end(), [](const RequestRecord& a, const RequestRecord& b) {
    return a.arrival < b.arrival;
  });
  std::vector<std::string> names;
  {
    std::lock_guard lock(files_mu_);
    names.reserve(files_.size());
    for (const auto& f : files_) names.push_back(json_string(f));
  }
  std::string out;
  out.reserve(recs.size() * 200);
  char buf[320];
  for (const auto& r : recs) {
    std::snprintf(buf, sizeof buf,
                  "{\"node\": %u, \"offset\": %llu, \"size\": %u, \"arrival_s\": %.9f, "
                  "\"modelled_s\": %.9f, \"service_s\": %.9f, \"seeks\": %u, \"direct\": %s, "
                  "\"file\": ",
                  static_cast<unsigned>(r.node), static_cast<unsigned long long>(r.offset), r.size,
                  r.arrival, r.modelled, r.service, static_cast<unsigned>(r.seeks),
                  r.direct ? "true" : "false");
    out += buf;
    out += r.file < names.size() ? names[r.file] : "null";
    out += "}\n";
  }
  return out;
}

}  // namespace feedline::emulator
