// SPDX-License-Identifier: Apache-2.0
// The LMDB indexer: a breadth-first walk of the main B+tree, one level at a time.
//
// Each level's pages are read in page-number order and runs of adjacent pages are read
// with one pread (up to max_read_bytes), because leaves written in key order are mostly
// adjacent; results are put back in key order by position. Overflow data is never read:
// a BIGDATA leaf node gives the run's first page, and the value starts one page header
// in. Trade-off: a level's parsed children are held in memory (a few bytes per page),
// which is what lets the reads be sorted and coalesced.
//
// Checks beyond each page's own validation (parse_tree_page): every key lies between
// its parent's separators and keys strictly increase, leaves sit exactly at the meta's
// depth, no page is reached twice, the meta's counts (entries, branch/leaf/overflow
// pages) match the walk, and, with check_pages, no page is owned twice by the main
// tree, an overflow run, the free tree or a free list (liblmdb's own invariant: every
// page up to last_pg is reachable exactly once).
#include <algorithm>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <feedline/detail/lmdb_format.hpp>
#include <feedline/errors.hpp>
#include <feedline/lmdb.hpp>

namespace feedline::lmdb {
namespace {

using namespace detail;

enum class Owner : std::uint8_t {
  meta,
  main_tree,
  main_overflow,
  free_tree,
  free_overflow,
  free_list
};

const char* owner_name(Owner o) {
  switch (o) {
    case Owner::meta: return "a meta page";
    case Owner::main_tree: return "a main-tree page";
    case Owner::main_overflow: return "a main-tree overflow run";
    case Owner::free_tree: return "a free-tree page";
    case Owner::free_overflow: return "a free-tree overflow run";
    case Owner::free_list: return "a free page";
  }
  return "?";
}

struct Range {
  std::uint64_t start;
  std::uint64_t count;
  Owner owner;
};

class Ranges {
 public:
  // Adjacent single pages of one owner are merged (free lists are sorted descending).
  void add(std::uint64_t start, std::uint64_t count, Owner owner) {
    if (!v_.empty() && v_.back().owner == owner) {
      Range& b = v_.back();
      if (b.start + b.count == start) {
        b.count += count;
        return;
      }
      if (start + count == b.start) {
        b.start = start;
        b.count += count;
        return;
      }
    }
    v_.push_back({start, count, owner});
  }
  std::vector<Range>& items() { return v_; }

 private:
  std::vector<Range> v_;
};

struct OverflowRun {
  std::uint64_t pgno;
  std::uint64_t pages;
  std::uint64_t length;
};

struct WalkCounts {
  std::uint64_t branch_pages = 0;
  std::uint64_t leaf_pages = 0;
};

class TreeWalker {
 public:
  TreeWalker(PreadFile& file, const Meta& meta, const IndexOptions& opts)
      : file_(file), meta_(meta), opts_(opts) {}

  /// Walk @p db level by level; call on_leaf(position, leaves, pgno, page, nodes) for
  /// every leaf, in page-number order (position gives its key order).
  template <class OnLeaf>
  WalkCounts walk(const DbInfo& db, bool free_db, Ranges* ranges, OnLeaf&& on_leaf) {
    WalkCounts counts;
    if (db.root == kInvalidPage) return counts;
    const std::uint32_t psize = meta_.page_size;
    const PageContext ctx{&file_.path(), psize, meta_.last_pgno, meta_.file_bytes, free_db};
    const KeyOrder order = free_db ? KeyOrder::integer : key_order_of(db.flags);
    const Owner owner = free_db ? Owner::free_tree : Owner::main_tree;
    const std::uint64_t max_run = std::max<std::uint64_t>(1, opts_.max_read_bytes / psize);

    std::vector<std::uint64_t> pages{db.root};
    std::vector<std::string> bounds(2);  // entry j covers [bounds[j], bounds[j+1])
    mark_visited(db.root);
    std::vector<std::uint8_t> buf;
    std::vector<Node> nodes;
    std::vector<std::size_t> order_idx;

    for (std::uint32_t level = 0; level < db.depth; ++level) {
      const bool leaf_level = level + 1 == db.depth;
      const std::size_t k = pages.size();
      std::vector<std::vector<std::uint64_t>> kids(leaf_level ? 0 : k);
      std::vector<std::vector<std::string>> seps(leaf_level ? 0 : k);
      order_idx.resize(k);
      std::iota(order_idx.begin(), order_idx.end(), std::size_t{0});
      std::sort(order_idx.begin(), order_idx.end(),
                [&](std::size_t a, std::size_t b) { return pages[a] < pages[b]; });

      for (std::size_t a = 0; a < k;) {
        std::size_t b = a + 1;
        while (b < k && pages[order_idx[b]] == pages[order_idx[b - 1]] + 1 && b - a < max_run) ++b;
        const std::uint64_t first = pages[order_idx[a]];
        const std::uint64_t bytes = (b - a) * std::uint64_t{psize};
        buf.resize(bytes);
        file_.read_exact(first * psize, bytes, buf.data(),
                         ("tree page " + std::to_string(first)).c_str());
        for (std::size_t t = a; t < b; ++t) {
          const std::size_t j = order_idx[t];
          const std::uint64_t pgno = pages[j];
          const std::uint8_t* p = buf.data() + (t - a) * psize;
          nodes.clear();
          const std::uint16_t flags = parse_tree_page(ctx, p, pgno, nodes);
          if ((flags == kLeaf) != leaf_level) {
            throw CorruptData(file_.path(), pgno * psize + 10,
                              "page " + std::to_string(pgno) + " is a " +
                                  (flags == kLeaf ? "leaf" : "branch") + " page at tree level " +
                                  std::to_string(level) + " of a tree of depth " +
                                  std::to_string(db.depth));
          }
          check_keys(order, free_db, p, pgno, nodes, leaf_level, j == 0 ? nullptr : &bounds[j],
                     j + 1 == k ? nullptr : &bounds[j + 1]);
          if (ranges) ranges->add(pgno, 1, owner);
          if (leaf_level) {
            ++counts.leaf_pages;
            on_leaf(j, k, pgno, p, nodes);
          } else {
            ++counts.branch_pages;
            kids[j].reserve(nodes.size());
            for (std::size_t i = 0; i < nodes.size(); ++i) {
              mark_visited(nodes[i].child);
              kids[j].push_back(nodes[i].child);
              if (i > 0) seps[j].emplace_back(key_of(p, nodes[i]));
            }
          }
        }
        a = b;
      }
      if (leaf_level) break;
      std::vector<std::uint64_t> next_pages;
      std::vector<std::string> next_bounds;
      next_bounds.emplace_back();
      for (std::size_t j = 0; j < k; ++j) {
        for (std::size_t i = 0; i < kids[j].size(); ++i) {
          next_pages.push_back(kids[j][i]);
          next_bounds.push_back(i + 1 < kids[j].size() ? std::move(seps[j][i])
                                                       : std::move(bounds[j + 1]));
        }
      }
      pages = std::move(next_pages);
      bounds = std::move(next_bounds);
    }
    return counts;
  }

  static std::string_view key_of(const std::uint8_t* p, const Node& n) {
    return {reinterpret_cast<const char*>(p) + n.key_pos, n.key_size};
  }

 private:
  void mark_visited(std::uint64_t pgno) {
    if (!visited_.insert(pgno).second) {
      throw CorruptData(file_.path(), pgno * meta_.page_size,
                        "page " + std::to_string(pgno) +
                            " is reached twice in the tree (cycle or shared subtree)");
    }
  }

  // Keys strictly increase and stay within [lo, hi) given by the parent. A branch's
  // first key is ignored (liblmdb never compares it), so its child 0 inherits lo.
  void check_keys(KeyOrder order, bool free_db, const std::uint8_t* p, std::uint64_t pgno,
                  const std::vector<Node>& nodes, bool leaf, const std::string* lo,
                  const std::string* hi) {
    const std::size_t s = leaf ? 0 : 1;
    const std::uint64_t off = pgno * meta_.page_size;
    std::string_view prev;
    for (std::size_t i = s; i < nodes.size(); ++i) {
      const std::string_view key = key_of(p, nodes[i]);
      if (order == KeyOrder::integer && key.size() != 8 && (free_db || key.size() != 4)) {
        throw CorruptData(file_.path(), off + nodes[i].key_pos,
                          "integer key of " + std::to_string(key.size()) + " bytes in page " +
                              std::to_string(pgno));
      }
      const bool bad = (i > s && compare_keys(order, prev, key) >= 0) ||
                       (i == s && lo && compare_keys(order, *lo, key) > (leaf ? 0 : -1)) ||
                       (i + 1 == nodes.size() && hi && compare_keys(order, key, *hi) >= 0);
      if (bad) {
        throw CorruptData(file_.path(), off + nodes[i].key_pos,
                          "key " + std::to_string(i) + " of page " + std::to_string(pgno) +
                              " is out of order (against its neighbours or its parent's "
                              "separators)");
      }
      prev = key;
    }
  }

  PreadFile& file_;
  const Meta& meta_;
  const IndexOptions& opts_;
  std::unordered_set<std::uint64_t> visited_;
};

std::uint64_t db_field_offset(const Meta& m, bool main, std::uint32_t field) {
  return std::uint64_t{m.meta_page ? m.page_size : 0u} + kPageHeader + 24 + (main ? kDbSize : 0) +
         field;
}

void expect_count(const std::string& path, const Meta& m, bool main, std::uint32_t field,
                  const char* what, std::uint64_t meta_value, std::uint64_t walked) {
  if (meta_value != walked) {
    throw CorruptData(path, db_field_offset(m, main, field),
                      std::string(main ? "main" : "free-page") + " database: meta says " +
                          std::to_string(meta_value) + " " + what + ", the tree has " +
                          std::to_string(walked));
  }
}

// Read overflow run headers: flags, own page number, run length >= what the value needs.
void verify_overflow_runs(PreadFile& file, const Meta& m, std::vector<OverflowRun>& runs) {
  std::vector<std::size_t> idx(runs.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return runs[a].pgno < runs[b].pgno; });
  std::uint8_t h[kPageHeader];
  for (const std::size_t i : idx) {
    OverflowRun& r = runs[i];
    const std::uint64_t off = r.pgno * m.page_size;
    file.read_exact(off, kPageHeader, h, "an overflow page header");
    const std::uint64_t self = load<std::uint64_t>(h);
    const std::uint16_t flags = load<std::uint16_t>(h + 10);
    const std::uint64_t pages = load<std::uint32_t>(h + 12);
    if (self != r.pgno || flags != kOverflow || pages < r.pages ||
        pages > m.last_pgno - r.pgno + 1 || r.pgno + pages > m.file_bytes / m.page_size) {
      throw CorruptData(file.path(), off,
                        "overflow run at page " + std::to_string(r.pgno) + " for a value of " +
                            std::to_string(r.length) + " bytes has a bad header (page " +
                            std::to_string(self) + ", flags " + std::to_string(flags) + ", " +
                            std::to_string(pages) + " pages)");
    }
    r.pages = pages;
  }
}

}  // namespace

Index index_lmdb(const std::string& path, const IndexOptions& options) {
  PreadFile file(path);
  const Meta meta = read_meta(file);
  const std::uint32_t psize = meta.page_size;
  TreeWalker walker(file, meta, options);
  Ranges ranges;
  Ranges* rp = options.check_pages ? &ranges : nullptr;
  ranges.add(0, 2, Owner::meta);

  // Leaves are visited in page order; each leaf's records are appended to these
  // columns and per_leaf[position] remembers where, to emit them in key order.
  std::vector<std::int64_t> off;
  std::vector<std::int64_t> len;
  std::vector<std::uint8_t> keys;
  std::vector<std::uint64_t> kstart;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> per_leaf;
  std::vector<OverflowRun> runs;
  std::uint64_t payload = 0;
  const WalkCounts main_counts =
      walker.walk(meta.main_db, false, rp,
                  [&](std::size_t pos, std::size_t leaves, std::uint64_t, const std::uint8_t* p,
                      const std::vector<Node>& nodes) {
                    if (per_leaf.empty()) per_leaf.assign(leaves, {0, 0});
                    per_leaf[pos] = {off.size(), nodes.size()};
                    for (const Node& n : nodes) {
                      off.push_back(static_cast<std::int64_t>(n.value_offset));
                      len.push_back(static_cast<std::int64_t>(n.value_length));
                      payload += n.value_length;
                      kstart.push_back(keys.size());
                      keys.insert(keys.end(), p + n.key_pos, p + n.key_pos + n.key_size);
                      if (n.flags & kBigData) {
                        runs.push_back({n.overflow_pgno, overflow_pages_for(n.value_length, psize),
                                        n.value_length});
                      }
                    }
                  });
  kstart.push_back(keys.size());

  const DbInfo& mdb = meta.main_db;
  expect_count(path, meta, true, 32, "entries", mdb.entries, off.size());
  expect_count(path, meta, true, 8, "branch pages", mdb.branch_pages, main_counts.branch_pages);
  expect_count(path, meta, true, 16, "leaf pages", mdb.leaf_pages, main_counts.leaf_pages);
  std::uint64_t ov_pages = 0;
  for (const OverflowRun& r : runs) ov_pages += r.pages;
  bool verified = false;
  if (options.verify_overflow || ov_pages < mdb.overflow_pages) {
    // liblmdb may rewrite a value in place into a longer run it already owned; only
    // the run headers tell the true lengths then.
    verify_overflow_runs(file, meta, runs);
    verified = true;
    ov_pages = 0;
    for (const OverflowRun& r : runs) ov_pages += r.pages;
  }
  expect_count(path, meta, true, 24, "overflow pages", mdb.overflow_pages, ov_pages);
  if (rp) {
    for (const OverflowRun& r : runs) ranges.add(r.pgno, r.pages, Owner::main_overflow);
  }

  IndexStats st;
  if (rp) {
    // The free tree: keys are txnids, values are page lists (count, then page numbers).
    std::uint64_t free_entries = 0;
    std::uint64_t free_ov = 0;
    std::vector<std::uint8_t> big;
    const WalkCounts fc = walker.walk(
        meta.free_db, true, rp,
        [&](std::size_t, std::size_t, std::uint64_t pgno, const std::uint8_t* p,
            const std::vector<Node>& nodes) {
          for (const Node& n : nodes) {
            ++free_entries;
            const std::uint8_t* data = nullptr;
            std::uint64_t data_off = n.value_offset;
            if (n.flags & kBigData) {
              OverflowRun r{n.overflow_pgno, overflow_pages_for(n.value_length, psize),
                            n.value_length};
              std::vector<OverflowRun> one{r};
              verify_overflow_runs(file, meta, one);
              big.resize(n.value_length);
              file.read_exact(n.value_offset, n.value_length, big.data(), "a free list");
              data = big.data();
              ranges.add(r.pgno, one[0].pages, Owner::free_overflow);
              free_ov += one[0].pages;
            } else {
              data = p + (n.value_offset - pgno * psize);
            }
            const std::uint64_t count = n.value_length >= 8 ? load<std::uint64_t>(data) : ~0ull;
            if (count > n.value_length / 8 - 1 || n.value_length < 8) {
              throw CorruptData(path, data_off,
                                "free list of " + std::to_string(n.value_length) +
                                    " bytes claims " + std::to_string(count) + " pages");
            }
            for (std::uint64_t i = 1; i <= count; ++i) {
              const std::uint64_t pg = load<std::uint64_t>(data + 8 * i);
              if (pg < 2 || pg > meta.last_pgno) {
                throw CorruptData(path, data_off + 8 * i,
                                  "free list names page " + std::to_string(pg) + ", outside [2, " +
                                      std::to_string(meta.last_pgno) + "]");
              }
              ranges.add(pg, 1, Owner::free_list);
              ++st.free_pages;
            }
          }
        });
    const DbInfo& fdb = meta.free_db;
    expect_count(path, meta, false, 32, "entries", fdb.entries, free_entries);
    expect_count(path, meta, false, 8, "branch pages", fdb.branch_pages, fc.branch_pages);
    expect_count(path, meta, false, 16, "leaf pages", fdb.leaf_pages, fc.leaf_pages);
    expect_count(path, meta, false, 24, "overflow pages", fdb.overflow_pages, free_ov);
    st.free_tree_pages = fc.branch_pages + fc.leaf_pages + free_ov;

    auto& items = ranges.items();
    std::sort(items.begin(), items.end(),
              [](const Range& a, const Range& b) { return a.start < b.start; });
    std::uint64_t owned = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      owned += items[i].count;
      if (i > 0 && items[i - 1].start + items[i - 1].count > items[i].start) {
        throw CorruptData(path, items[i].start * psize,
                          "page " + std::to_string(items[i].start) + " is used twice: as " +
                              owner_name(items[i - 1].owner) + " and as " +
                              owner_name(items[i].owner));
      }
    }
    st.unaccounted_pages = meta.last_pgno + 1 - owned;
    st.pages_checked = true;
  }

  Index out;
  const std::size_t n = off.size();
  out.offsets.reserve(n);
  out.lengths.reserve(n);
  out.key_blob.reserve(keys.size());
  out.key_starts.reserve(n + 1);
  for (const auto& [first, count] : per_leaf) {
    for (std::uint64_t r = first; r < first + count; ++r) {
      out.offsets.push_back(off[r]);
      out.lengths.push_back(len[r]);
      out.key_starts.push_back(static_cast<std::int64_t>(out.key_blob.size()));
      out.key_blob.insert(out.key_blob.end(), keys.begin() + static_cast<std::ptrdiff_t>(kstart[r]),
                          keys.begin() + static_cast<std::ptrdiff_t>(kstart[r + 1]));
    }
  }
  out.key_starts.push_back(static_cast<std::int64_t>(out.key_blob.size()));

  st.page_size = psize;
  st.txnid = meta.txnid;
  st.last_pgno = meta.last_pgno;
  st.meta_page = meta.meta_page;
  st.file_bytes = meta.file_bytes;
  st.entries = n;
  st.depth = mdb.depth;
  st.branch_pages = main_counts.branch_pages;
  st.leaf_pages = main_counts.leaf_pages;
  st.overflow_pages = ov_pages;
  st.overflow_records = runs.size();
  st.payload_bytes = payload;
  st.key_bytes = keys.size();
  st.overflow_verified = verified;
  st.bytes_read = file.bytes_read;
  st.read_ops = file.read_ops;
  out.stats = st;
  return out;
}

}  // namespace feedline::lmdb
