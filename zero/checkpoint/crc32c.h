#pragma once
// CRC-32C (Castagnoli), the checksum of the checkpoint files: the polynomial iSCSI, ext4 and
// Snappy use, in its usual form (reflected, initial and final XOR 0xFFFFFFFF), so that the value of
// a file equals what other tools compute for it. Incremental: crc32c(b, crc32c(a)) == crc32c(ab).
#include <cstddef>
#include <cstdint>

namespace zero {

// The SSE4.2 instruction where the CPU has it, else slicing-by-8 tables.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// Always the tables (the tests compare the two).
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);
// crc32c(ab) from crc32c(a), crc32c(b) and b's length, without the bytes (zlib's crc32_combine):
// a file's checksum from its pieces'.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

}  // namespace zero
