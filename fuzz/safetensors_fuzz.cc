// Fuzz target: the safetensors header reader (zero/checkpoint/safetensors.h), the input being a whole file.
//
// A bad header must end in a zero::Error (InvalidArgument naming the file). An accepted header must
// describe what the readers after it rely on (import_safetensors, zero_plan): tensors in data order,
// contiguous from 0, each holding exactly its shape's bytes, ending where the file does; and our
// writer, given the same tensors, must lay them out at the same offsets, in a header the reader
// accepts again.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"
#include "fuzz/fuzz_check.h"
#include "zero/checkpoint/safetensors.h"

namespace {

const std::string kSource = "fuzz.safetensors";

uint64_t shape_bytes(const zero::SafetensorsTensor& t) {
  uint64_t n = zero::dtype_size(t.dtype);
  for (int64_t d : t.shape) {
    FUZZ_CHECK(d >= 0, "tensor '%s' has a negative dimension", t.name.c_str());
    // The reader checked that the product fits; recomputing it must not overflow.
    FUZZ_CHECK(d == 0 || n <= UINT64_MAX / static_cast<uint64_t>(d), "tensor '%s' overflows", t.name.c_str());
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  zero::SafetensorsLayout layout;
  try {
    layout = zero::parse_safetensors_header(file, size, kSource);
  } catch (const zero::Error&) {
    return 0;
  }
  FUZZ_CHECK(layout.data_start >= 8 + 2 && layout.data_start <= size, "data_start %llu",
             static_cast<unsigned long long>(layout.data_start));
  FUZZ_CHECK(layout.file_bytes() == size, "the tensors end at %llu of %zu bytes",
             static_cast<unsigned long long>(layout.file_bytes()), size);
  uint64_t at = 0;
  for (const zero::SafetensorsTensor& t : layout.tensors) {
    FUZZ_CHECK(t.begin == at && t.end >= t.begin, "tensor '%s' is not where the one before it ends", t.name.c_str());
    FUZZ_CHECK(t.end - t.begin == shape_bytes(t), "tensor '%s' does not hold its shape", t.name.c_str());
    at = t.end;
  }

  // The writer, from the same tensors and metadata, in the same order.
  zero::SafetensorsLayout again;
  again.metadata = layout.metadata;
  for (const zero::SafetensorsTensor& t : layout.tensors) again.tensors.push_back({t.name, t.dtype, t.shape});
  const std::string header = zero::safetensors_header(again);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    FUZZ_CHECK(again.tensors[i].begin == layout.tensors[i].begin && again.tensors[i].end == layout.tensors[i].end,
               "the writer puts tensor '%s' elsewhere", layout.tensors[i].name.c_str());
  }
  // Read back without the data bytes: only the file size matters to the header.
  const uint64_t data_bytes = size - layout.data_start;
  const zero::SafetensorsLayout back = zero::parse_safetensors_header(header, header.size() + data_bytes, kSource);
  FUZZ_CHECK(back.tensors.size() == layout.tensors.size() && back.metadata == layout.metadata,
             "the written header reads back different");
  for (size_t i = 0; i < back.tensors.size(); ++i) {
    FUZZ_CHECK(back.tensors[i].name == layout.tensors[i].name && back.tensors[i].shape == layout.tensors[i].shape &&
                   back.tensors[i].dtype == layout.tensors[i].dtype && back.tensors[i].begin == layout.tensors[i].begin,
               "tensor '%s' reads back different", layout.tensors[i].name.c_str());
  }
  return 0;
}
