// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: HDF5 chunk filters (unfilter_chunk: deflate through libdeflate, byte
// shuffle, LZF) on arbitrary stored bytes. A 5-byte prefix chooses the pipeline, the
// filter mask, the element size and the chunk's declared (unfiltered) size; the rest is
// the stored chunk, in a buffer of exactly its size (as are the output and scratch
// buffers, so ASan sees any write or read past them). Any input must unfilter or return
// a reason; a byte shuffle that succeeds must agree with a plain reference.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <feedline/unpack.hpp>

namespace {

// HDF5 pipelines in write order (unfilter_chunk undoes them in reverse); 3 is Fletcher32,
// which feedline does not undo.
const int kDeflate[] = {1};
const int kShuffleDeflate[] = {2, 1};
const int kLzf[] = {32000};
const int kShuffleLzf[] = {2, 32000};
const int kShuffle[] = {2};
const int kShuffleDeflateFletcher[] = {2, 1, 3};
struct Pipeline {
  const int* filters;
  std::size_t n;
};
const Pipeline kPipelines[] = {
    {kDeflate, 1},    {kShuffleDeflate, 2}, {kLzf, 1},
    {kShuffleLzf, 2}, {kShuffle, 1},        {kShuffleDeflateFletcher, 3},
};
constexpr std::size_t kHeader = 5;
constexpr std::size_t kMaxOut = std::size_t{1} << 20;

void reference_unshuffle(const std::uint8_t* in, std::uint8_t* out, std::size_t n,
                         std::size_t item) {
  const std::size_t elems = item ? n / item : 0;
  for (std::size_t i = 0; i < elems; ++i)
    for (std::size_t j = 0; j < item; ++j) out[i * item + j] = in[j * elems + i];
  for (std::size_t k = elems * item; k < n; ++k) out[k] = in[k];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < kHeader) return 0;
  // byte 0: pipeline (low 3 bits, mod 6) and filter mask (bits 3-5)
  const Pipeline& p = kPipelines[(data[0] & 7) % 6];
  const std::uint32_t mask = (data[0] >> 3) & 7;
  // byte 1: element size 1..16, or 0 (treated as 1 by the shuffle filter)
  const std::size_t itemsize = data[1] == 0xff ? 0 : 1 + (data[1] & 15);
  // bytes 2-4: declared chunk size, < 1 MiB
  const std::size_t out_size =
      (data[2] | (std::size_t{data[3]} << 8) | (std::size_t{data[4]} << 16)) & (kMaxOut - 1);
  const std::size_t in_size = size - kHeader;
  // stored bytes and output in allocations of exactly their size (non-null when empty)
  const std::unique_ptr<std::uint8_t[]> in(new std::uint8_t[in_size]);
  if (in_size) std::memcpy(in.get(), data + kHeader, in_size);
  const std::unique_ptr<std::uint8_t[]> out(new std::uint8_t[out_size]);
  std::vector<std::uint8_t> scratch;  // fresh: capacity == the size unfilter_chunk asks for
  const auto err = feedline::unfilter_chunk(in.get(), in_size, p.filters, p.n, mask, itemsize,
                                            out.get(), out_size, scratch);
  if (err && err->empty()) __builtin_trap();  // a failure always says why
  if (!err && p.filters == kShuffle && !(mask & 1)) {
    // shuffle alone: the output is the reference unshuffle of the input (vector paths)
    if (in_size != out_size) __builtin_trap();
    std::vector<std::uint8_t> ref(out_size);
    reference_unshuffle(in.get(), ref.data(), out_size, itemsize <= 1 ? 1 : itemsize);
    if (out_size && std::memcmp(ref.data(), out.get(), out_size) != 0) __builtin_trap();
  }
  // LZF alone into one byte less than the declared size: never past the output
  if (out_size) {
    const std::unique_ptr<std::uint8_t[]> lzf(new std::uint8_t[out_size - 1]);
    (void)feedline::lzf_decompress(in.get(), in_size, lzf.get(), out_size - 1);
  }
  return 0;
}
