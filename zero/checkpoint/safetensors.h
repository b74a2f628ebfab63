#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {string: string}}, then the data. Offsets are relative to the end of the
// header, contiguous from 0 in file order with no holes; we pad the header with spaces to a
// multiple of 8 bytes, as the reference writer does, so every tensor starts 8-byte aligned.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"

namespace zero {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, from the end of the header
};

struct SafetensorsLayout {
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length: where offset 0 is in the file
  uint64_t file_bytes() const { return data_start + (tensors.empty() ? 0 : tensors.back().end); }
};

// "F32", "F16", "BF16", "F64", "I32", "I64", "U8".
const char* safetensors_dtype(DType t);

// Lays out `tensors` (name, dtype, shape; offsets are filled in, in the given order) and returns the
// header bytes to write at the start of the file (length prefix included).
std::string safetensors_header(SafetensorsLayout& layout);

// The largest header (the JSON, without the 8-byte length) we accept: the reference reader's limit.
// A length field beyond it is refused before anything is allocated for it.
constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// The JSON header's length from the file's first 8 bytes (`prefix8`), validated against a file of
// `file_size` bytes: at least 2, at most kMaxSafetensorsHeaderBytes and within the file. `source`
// (a file name) starts every error; all errors are InvalidArgument.
uint64_t safetensors_header_length(const uint8_t prefix8[8], uint64_t file_size, const std::string& source);

// Parses and validates a header from `bytes`, the start of a file of `file_size` bytes: the 8-byte
// length (as safetensors_header_length), the JSON, each entry's dtype, shape and offsets (in range,
// contiguous from 0, no holes, the byte count of its shape and dtype), and that the data ends where
// the file does. `bytes` must hold at least the length and the header it announces; what follows
// (the data, when a whole file is given) is not read. Throws InvalidArgument naming `source` (and
// the entry) for anything wrong, including a `bytes` shorter than the header it announces.
SafetensorsLayout parse_safetensors_header(std::string_view bytes, uint64_t file_size, const std::string& source);

// parse_safetensors_header of the start of the file `path`, reading only the header. Throws IoError
// naming the file for an unreadable file, InvalidArgument naming the file and the entry otherwise.
SafetensorsLayout read_safetensors_header(const std::string& path);

}  // namespace zero
