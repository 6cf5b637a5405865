// SPDX-License-Identifier: Apache-2.0
/**
 * @file unpack.hpp
 * @brief Compressed spans of the native core: HDF5 filtered chunks (deflate, byte
 *        shuffle, LZF) and gzip-compressed TFRecord files (one-pass scan with restart
 *        points, bounded-cost inflate of one segment).
 *
 * A *span* is the stored (compressed) bytes that must be read and unpacked to get some
 * samples: one HDF5 chunk, or one segment of a gzip stream (from a restart point to the
 * end of the last record that starts in it). Everything read from a file is
 * bounds-checked; a contradiction is reported as a reason string (batch functions) or
 * feedline::CorruptData naming the file and byte offset (the scanner). Reentrant; no
 * global state.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace feedline {

// ------------------------------------------------------------------ HDF5 chunks

/// @brief HDF5 filter ids feedline unpacks (H5Z_FILTER_DEFLATE, _SHUFFLE, h5py's LZF).
enum class ChunkFilter : int { deflate = 1, shuffle = 2, lzf = 32000 };

/// @brief True when feedline can undo HDF5 filter @p id.
bool chunk_filter_supported(int id) noexcept;

/**
 * @brief Undo an HDF5 filter pipeline on one chunk.
 *
 * Filters were applied in pipeline order 0..n-1 when writing; they are undone in reverse
 * order, skipping filter i when bit i of @p mask is set (HDF5 skips an optional filter
 * that fails, e.g. LZF on incompressible data, and records it in the chunk's mask).
 * Every intermediate result must be exactly @p out_size bytes (the chunk's size).
 * @param in stored chunk bytes
 * @param in_size number of stored bytes
 * @param filters filter ids in pipeline order
 * @param nfilters number of filters
 * @param mask the chunk's filter mask
 * @param itemsize element size for the shuffle filter
 * @param out destination of @p out_size bytes
 * @param out_size the chunk's unfiltered size
 * @param scratch work buffer (resized as needed; reuse it across calls)
 * @return std::nullopt on success, else why the chunk is corrupt
 */
std::optional<std::string> unfilter_chunk(const std::uint8_t* in, std::size_t in_size,
                                          const int* filters, std::size_t nfilters,
                                          std::uint32_t mask, std::size_t itemsize,
                                          std::uint8_t* out, std::size_t out_size,
                                          std::vector<std::uint8_t>& scratch);

/// @brief LZF decompression of exactly @p out_size bytes (liblzf's format, as h5py writes it).
std::optional<std::string> lzf_decompress(const std::uint8_t* in, std::size_t in_size,
                                          std::uint8_t* out, std::size_t out_size);

/// @brief Undo HDF5's byte shuffle of @p n bytes of @p itemsize-byte elements.
void unshuffle(const std::uint8_t* in, std::uint8_t* out, std::size_t n,
               std::size_t itemsize) noexcept;

// ---------------------------------------------------------------- gzip TFRecord

/// @brief Bytes of history a restart point inside a deflate stream keeps.
inline constexpr std::size_t kGzipWindow = 32768;

/// @brief Where records of a gzip TFRecord file live in its decompressed stream.
struct GzipTFRecordIndex {
  // per record
  std::vector<std::int32_t> segment;  ///< segment holding the record's payload start
  std::vector<std::int64_t> at;       ///< payload offset in the segment's output
  std::vector<std::int64_t> length;   ///< payload length
  // per segment (a restart point and the compressed bytes its records need)
  std::vector<std::int64_t> start;    ///< compressed offset (byte holding the first bit)
  std::vector<std::int64_t> end;      ///< compressed end (exclusive) covering its records
  std::vector<std::int64_t> out;      ///< output bytes its records (and their CRCs) need
  std::vector<std::int32_t> bits;     ///< -1: a gzip member starts at @c start; else the
                                      ///< number of bits of byte @c start still unread
  std::vector<std::int32_t> window;   ///< index of its window in @c windows, -1 if none
  std::vector<std::uint8_t> windows;  ///< kGzipWindow bytes per restart inside a member
  std::uint64_t members = 0;          ///< gzip members in the file
  std::uint64_t stream_bytes = 0;     ///< decompressed size
  std::uint64_t reads = 0;
  std::uint64_t bytes_read = 0;
};

/**
 * @brief Scan a gzip-compressed TFRecord file in one pass.
 *
 * Inflates the whole file (concatenated gzip members allowed), parses and CRC-checks the
 * TFRecord frames of the decompressed stream, and places a restart point at every member
 * start and, inside a member, at the first deflate block boundary after every
 * @p spacing bytes of output (saving the 32 KiB window there), so that any record can be
 * had by inflating at most about @p spacing + its own size bytes.
 * @throws CorruptData (file, compressed offset, reason) for bad gzip or bad frames
 * @throws StorageFailure when the file cannot be read
 */
GzipTFRecordIndex scan_gzip_tfrecord(const std::string& path, std::size_t spacing,
                                     std::size_t buffer_bytes, bool verify_data);

/// @brief scan_gzip_tfrecord() of a memory buffer (@p name is used in errors). For tests.
GzipTFRecordIndex scan_gzip_tfrecord_bytes(const std::uint8_t* data, std::size_t size,
                                           const std::string& name, std::size_t spacing,
                                           bool verify_data);

/**
 * @brief Inflate the first @p out_size bytes of a segment.
 * @param in the segment's compressed bytes (from its @c start)
 * @param in_size their number
 * @param bits the segment's @c bits (-1: a gzip member starts at @p in)
 * @param window its 32 KiB window (null when @p bits is -1)
 * @param out destination of @p out_size bytes
 * @return std::nullopt on success, else why the bytes are corrupt
 */
std::optional<std::string> inflate_segment(const std::uint8_t* in, std::size_t in_size, int bits,
                                           const std::uint8_t* window, std::uint8_t* out,
                                           std::size_t out_size);

/**
 * @brief Check the TFRecord payload CRCs of unpacked records.
 *
 * Record i is @p size[i] bytes at @p src[i] of @p buf, followed by its 4-byte masked
 * CRC32C (as in the decompressed stream).
 * @return the first record whose CRC does not match (or lies outside @p buf), else -1
 */
std::int64_t check_tfrecord_crcs(const std::uint8_t* buf, std::size_t buf_size,
                                 const std::int64_t* src, const std::int64_t* size,
                                 std::size_t count) noexcept;

}  // namespace feedline
