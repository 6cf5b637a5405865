// SPDX-License-Identifier: Apache-2.0
/** @file records.hpp
 *  @brief Copying records between buffers: what every source does to turn a read
 *         window into a batch (a gather), and what the DeepIO store does to fill a
 *         batch from its parts (a scatter into given places).
 *
 *  One `memcpy` per record, no temporary; every extent is checked against both buffers
 *  before the first byte moves, so a bad plan or a corrupt index raises instead of
 *  reading or writing out of bounds.
 */
#pragma once
#include <cstddef>
#include <cstdint>

namespace feedline {

/**
 * @brief out[dest[i] .. dest[i] + len[i]) = src[from[i] .. from[i] + len[i]) for every
 *        record i < @p count.
 *
 * @param dest the records' places in @p out; nullptr packs them in order from 0 (a gather).
 * @throws std::out_of_range naming the first record whose extent is negative or falls
 *         outside @p src or @p out; nothing is copied then.
 */
void copy_records(const std::uint8_t* src, std::size_t src_size, const std::int64_t* from,
                  const std::int64_t* len, std::size_t count, std::uint8_t* out,
                  std::size_t out_size, const std::int64_t* dest);

}  // namespace feedline
