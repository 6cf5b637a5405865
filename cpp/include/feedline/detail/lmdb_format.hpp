// SPDX-License-Identifier: Apache-2.0
/**
 * @file lmdb_format.hpp
 * @brief Private: LMDB 0.9 on-disk constants (64-bit layout), little-endian loads,
 *        a counting pread file, and the page/meta validators shared by the indexer
 *        and LmdbFile. Not installed API.
 */
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/lmdb.hpp>

namespace feedline::lmdb::detail {

static_assert(std::endian::native == std::endian::little,
              "the LMDB parser reads little-endian files on a little-endian host");

// Page header (MDB_page, 64-bit): pgno u64 @0, pad u16 @8, flags u16 @10,
// lower u16 @12, upper u16 @14 (or overflow page count u32 @12), slot array @16.
inline constexpr std::uint32_t kPageHeader = 16;
inline constexpr std::uint32_t kPageHeader32 = 12;  // 32-bit builds (unsupported)
inline constexpr std::uint16_t kBranch = 0x01;
inline constexpr std::uint16_t kLeaf = 0x02;
inline constexpr std::uint16_t kOverflow = 0x04;
inline constexpr std::uint16_t kMetaPage = 0x08;
inline constexpr std::uint16_t kLeaf2 = 0x20;

// Node (MDB_node): lo u16 @0, hi u16 @2, flags u16 @4, ksize u16 @6, key @8.
inline constexpr std::uint32_t kNodeHeader = 8;
inline constexpr std::uint16_t kBigData = 0x01;
inline constexpr std::uint16_t kSubData = 0x02;
inline constexpr std::uint16_t kDupData = 0x04;

// Meta (MDB_meta) at kPageHeader: magic u32 @0, version u32 @4, address @8,
// mapsize @16, dbs[2] (48 bytes each) @24, last_pg @120, txnid @128.
inline constexpr std::uint32_t kMagic = 0xBEEFC0DE;
inline constexpr std::uint32_t kDataVersion = 1;
inline constexpr std::uint32_t kDevelVersion = 999;
inline constexpr std::uint32_t kMetaSize = 136;
inline constexpr std::uint32_t kMetaRead = kPageHeader + kMetaSize;
inline constexpr std::uint32_t kDbSize = 48;

// Database flags (MDB_db.md_flags).
inline constexpr std::uint16_t kReverseKey = 0x02;
inline constexpr std::uint16_t kDupSort = 0x04;
inline constexpr std::uint16_t kIntegerKey = 0x08;
inline constexpr std::uint16_t kDupFixed = 0x10;
inline constexpr std::uint16_t kIntegerDup = 0x20;
inline constexpr std::uint16_t kReverseDup = 0x40;
inline constexpr std::uint16_t kKnownDbFlags =
    kReverseKey | kDupSort | kIntegerKey | kDupFixed | kIntegerDup | kReverseDup;

inline constexpr std::uint32_t kMinPageSize = 512;
inline constexpr std::uint32_t kMaxPageSize = 32768;  // liblmdb 0.9 MAX_PAGESIZE
inline constexpr std::uint32_t kMaxDepth = 32;        // liblmdb CURSOR_STACK

template <class T>
inline T load(const std::uint8_t* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// Pages an overflow value of @p size occupies (liblmdb's OVPAGES).
inline std::uint64_t overflow_pages_for(std::uint64_t size, std::uint32_t psize) noexcept {
  return (kPageHeader - 1 + size) / psize + 1;
}

/// Node sizes are padded to 2 bytes.
inline std::uint32_t even(std::uint32_t n) noexcept { return (n + 1u) & ~1u; }

/// @brief A read-only descriptor that counts what it reads. Not thread-safe.
class PreadFile {
 public:
  explicit PreadFile(const std::string& path);
  ~PreadFile();
  PreadFile(PreadFile&& o) noexcept;
  PreadFile& operator=(PreadFile&& o) noexcept;
  PreadFile(const PreadFile&) = delete;
  PreadFile& operator=(const PreadFile&) = delete;

  /// Read up to @p len bytes at @p off; returns bytes read (short only at EOF).
  std::uint64_t read(std::uint64_t off, std::uint64_t len, std::uint8_t* out);
  /// Read exactly @p len bytes or throw CorruptData naming @p what.
  void read_exact(std::uint64_t off, std::uint64_t len, std::uint8_t* out, const char* what);

  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }
  std::uint64_t bytes_read = 0;
  std::uint64_t read_ops = 0;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// Read both meta pages and select the newest valid one. Throws on failure.
Meta read_meta(PreadFile& file);

/// Key order of a database (liblmdb's comparators for its flags).
enum class KeyOrder : std::uint8_t { bytes, reverse_bytes, integer };
KeyOrder key_order_of(std::uint16_t db_flags) noexcept;
/// <0, 0, >0 like memcmp, in the database's key order.
int compare_keys(KeyOrder order, std::string_view a, std::string_view b) noexcept;

/// What a page is expected to be while walking a tree.
struct PageContext {
  const std::string* path = nullptr;
  std::uint32_t page_size = 0;
  std::uint64_t last_pgno = 0;
  std::uint64_t file_bytes = 0;
  bool free_db = false;  ///< walking FREE_DBI (8-byte integer keys, IDL values)
};

/**
 * Validate the branch or leaf page in @p p (page_size bytes) that must be page
 * @p pgno, and append its nodes to @p nodes. Checks the header, that the slots tile
 * the node area exactly, every node's bounds and flags, child and overflow page
 * numbers. Throws CorruptData / Unsupported.
 * @return the page flags (kBranch or kLeaf)
 */
std::uint16_t parse_tree_page(const PageContext& ctx, const std::uint8_t* p, std::uint64_t pgno,
                              std::vector<Node>& nodes);

}  // namespace feedline::lmdb::detail
