#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {string: string}}, then the data. Offsets are relative to the end of the
// header, contiguous from 0 in file order with no holes; we pad the header with spaces to a
// multiple of 8 bytes, as the reference writer does, so every tensor starts 8-byte aligned.
#include <cstdint>
#include <map>
#include <string>
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

// Reads and validates the header of `path`: the length (at least 2, at most 100 MB and within the
// file), the JSON, each entry's dtype, shape and offsets (in range, contiguous from 0, no holes, the
// byte count of its shape and dtype), and that the data ends where the file does. Throws IoError
// naming the file for an unreadable file, InvalidArgument naming the file and the entry otherwise.
SafetensorsLayout read_safetensors_header(const std::string& path);

}  // namespace zero
