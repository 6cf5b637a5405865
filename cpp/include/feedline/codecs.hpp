// SPDX-License-Identifier: Apache-2.0
/**
 * @file codecs.hpp
 * @brief Record codecs of the native core: CRC32C, the TFRecord frame scanner and the
 *        Caffe `Datum` protobuf parser / batch decoder.
 *
 * Everything here trusts nothing it reads: every length, count and shape read from a
 * file is bounds-checked, and a contradiction is reported as feedline::CorruptData
 * naming the file (or sample) and the byte offset. All functions are reentrant; none
 * keeps global mutable state except the one-time choice of the CRC32C implementation.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace feedline {

// ------------------------------------------------------------------------ CRC32C

/**
 * @brief CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of @p n bytes.
 *
 * Uses the SSE4.2 `crc32` instruction when the CPU has it, else slicing-by-8 tables.
 * @param data bytes (may be null when @p n is 0)
 * @param n number of bytes
 * @param crc CRC of the preceding bytes, to extend a running CRC (0 to start)
 * @return the CRC32C of the preceding bytes followed by these
 */
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

/// @brief TFRecord's masking of a CRC: rotate right by 15 and add 0xa282ead8.
constexpr std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// @brief Inverse of mask_crc32c().
constexpr std::uint32_t unmask_crc32c(std::uint32_t masked) noexcept {
  const std::uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

/// @brief mask_crc32c(crc32c(data, n)): the checksum a TFRecord frame stores.
std::uint32_t masked_crc32c(const void* data, std::size_t n) noexcept;

namespace detail {
/// @brief Slicing-by-8 CRC32C (portable; used when SSE4.2 is absent). For tests.
std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc) noexcept;
/// @brief True when crc32c() uses the SSE4.2 instruction on this CPU.
bool crc32c_hardware() noexcept;
/// @brief The SSE4.2 CRC32C; falls back to crc32c_portable() where unavailable. For tests.
std::uint32_t crc32c_sse42(const void* data, std::size_t n, std::uint32_t crc) noexcept;
}  // namespace detail

// ---------------------------------------------------------------------- TFRecord

/// @brief How scan_tfrecord() reads.
struct TFRecordScanOptions {
  std::size_t buffer_bytes = std::size_t{8} << 20;  ///< size of each sequential pread
  bool verify_data = true;                          ///< check every payload CRC (reads every byte)
};

/**
 * @brief Where the payloads of a TFRecord file are.
 *
 * offsets[i] is the byte offset of record i's payload (after its 12-byte header),
 * lengths[i] its length. reads/bytes_read count the preads the scan issued.
 */
struct TFRecordIndex {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> lengths;
  std::uint64_t reads = 0;
  std::uint64_t bytes_read = 0;
};

/**
 * @brief Scan the frames of a TFRecord file with large sequential preads.
 *
 * A frame is: u64 length (LE), u32 masked CRC32C of those 8 bytes, payload, u32 masked
 * CRC32C of the payload. Both CRCs are verified (the payload's unless
 * options.verify_data is false).
 * @param path file to scan (opened read-only, never mapped)
 * @param options buffer size and verification
 * @return offsets and lengths of every payload
 * @throws CorruptData on a CRC mismatch, truncation or a length beyond the file,
 *         naming the frame's byte offset
 * @throws StorageFailure when the file cannot be opened or read
 */
TFRecordIndex scan_tfrecord(const std::string& path, const TFRecordScanOptions& options = {});

/**
 * @brief scan_tfrecord() over bytes already in memory (@p name is used in errors).
 */
TFRecordIndex scan_tfrecord_bytes(const std::uint8_t* data, std::size_t size,
                                  const std::string& name, bool verify_data = true);

// ------------------------------------------------------------------------- Datum

/**
 * @brief The fields of one Caffe `Datum` record (protobuf, caffe.proto).
 *
 * Field numbers: 1 channels, 2 height, 3 width (varint), 4 data (bytes), 5 label
 * (int32 varint), 6 float_data (repeated float, packed or not), 7 encoded (bool).
 * Byte positions are relative to the start of the record.
 */
struct DatumInfo {
  std::int64_t channels = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t label = 0;
  bool encoded = false;
  std::uint64_t data_offset = 0;  ///< where the `data` bytes start
  std::uint64_t data_size = 0;    ///< length of `data` (0 when absent)
  std::uint64_t float_count = 0;  ///< number of `float_data` values
};

/**
 * @brief Parse and validate one Datum.
 *
 * Unknown fields are skipped by wire type; known fields with a wrong wire type, group
 * wire types, overlong varints, lengths beyond the record, a label outside int32 and
 * negative or absurd dimensions are errors. When @p floats is not null the
 * `float_data` values are written to it (it must have room for @p float_capacity values;
 * more is an error).
 * @param rec record bytes
 * @param n record length
 * @param name used as the path of a CorruptData error
 * @param floats optional destination of `float_data`
 * @param float_capacity room in @p floats
 * @throws CorruptData naming @p name and the offset within the record
 */
DatumInfo parse_datum(const std::uint8_t* rec, std::size_t n, const std::string& name,
                      float* floats = nullptr, std::size_t float_capacity = 0);

/// @brief What decode_datum_batch() fills from each Datum.
enum class DatumPayload : int {
  bytes = 0,   ///< `data` → uint8 (C, H, W)
  floats = 1,  ///< `float_data` → float32 (C, H, W)
};

/// @brief The expected shape of every Datum in a batch and where the results go.
struct DatumBatchSpec {
  std::int64_t channels = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  DatumPayload payload = DatumPayload::bytes;
  /// (count, C*H*W) samples of uint8 (bytes) or float32 (floats); row i is sample i
  void* out = nullptr;
  /// count labels
  std::int64_t* labels = nullptr;
  /// count flags, set to 1 for an `encoded` Datum (its image bytes are then reported in
  /// encoded_offsets/encoded_lengths, relative to the batch, and its row is not
  /// written). When null, an encoded Datum is an error.
  std::uint8_t* encoded = nullptr;
  std::int64_t* encoded_offsets = nullptr;
  std::int64_t* encoded_lengths = nullptr;
};

/// @brief Why a batch could not be decoded: which sample, where in it, and why.
struct DatumFault {
  std::int64_t sample = 0;   ///< position in the batch
  std::uint64_t offset = 0;  ///< byte offset within that sample's record
  std::string reason;
};

/**
 * @brief Decode a batch of concatenated Datum records into preallocated arrays.
 *
 * Every sample must have the shape of @p spec (an encoded Datum's shape is checked by
 * the caller after decoding its image). Does not throw for bad data: the first bad
 * sample is returned as a DatumFault, so the caller can name its file and offset.
 * @param raw the records, concatenated
 * @param raw_size bytes in @p raw
 * @param lengths length of each record
 * @param count number of records
 * @param spec expected shape and outputs
 * @return std::nullopt on success, else the first fault
 */
std::optional<DatumFault> decode_datum_batch(const std::uint8_t* raw, std::size_t raw_size,
                                             const std::int64_t* lengths, std::size_t count,
                                             const DatumBatchSpec& spec);

}  // namespace feedline
