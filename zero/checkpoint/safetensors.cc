#include "zero/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "zero/checkpoint/file_io.h"

namespace zero {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kNames[] = {{DType::kFloat32, "F32"}, {DType::kFloat16, "F16"}, {DType::kBFloat16, "BF16"},
                                {DType::kFloat64, "F64"}, {DType::kInt32, "I32"},   {DType::kInt64, "I64"},
                                {DType::kUInt8, "U8"}};

// Elements of `shape`, or false when a dimension is negative or the product overflows.
bool elements(const std::vector<int64_t>& shape, uint64_t* n) {
  uint64_t p = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && p > UINT64_MAX / static_cast<uint64_t>(d)) return false;
    p *= static_cast<uint64_t>(d);
  }
  *n = p;
  return true;
}

// The file must hold the 8-byte length field before anything else is looked at.
void require_length_field(uint64_t file_size, const std::string& source) {
  if (file_size < 8) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': {} bytes, too short for the header length", source, file_size);
  }
}

}  // namespace

const char* safetensors_dtype(DType t) {
  for (const DTypeName& n : kNames) {
    if (n.dtype == t) return n.name;
  }
  ZERO_THROW(InvalidArgument, "safetensors: no dtype for {}", dtype_name(t));
}

std::string safetensors_header(SafetensorsLayout& layout) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!layout.metadata.empty()) j["__metadata__"] = layout.metadata;
  uint64_t offset = 0;
  for (SafetensorsTensor& t : layout.tensors) {
    uint64_t n = 0;
    ZERO_CHECK(elements(t.shape, &n), "tensor '{}' has a bad shape", t.name);
    t.begin = offset;
    t.end = offset + n * dtype_size(t.dtype);
    offset = t.end;
    j[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  layout.data_start = 8 + text.size();
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + text;
}

uint64_t safetensors_header_length(const uint8_t prefix8[8], uint64_t file_size, const std::string& source) {
  require_length_field(file_size, source);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix8[i];
  if (n < 2 || n > kMaxSafetensorsHeaderBytes || n > file_size - 8) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': header length {} is impossible (file of {} bytes, limit {})", source,
               n, file_size, kMaxSafetensorsHeaderBytes);
  }
  return n;
}

SafetensorsLayout read_safetensors_header(const std::string& path) {
  const FileReader file(path);  // IoError naming the file when it cannot be opened
  const uint64_t size = file.size();
  require_length_field(size, path);
  uint8_t len_bytes[8];
  file.read(len_bytes, 8, 0);
  // Validated before the allocation: a damaged length field cannot ask for more than the limit.
  const uint64_t n = safetensors_header_length(len_bytes, size, path);
  std::string bytes(8 + n, '\0');
  std::memcpy(bytes.data(), len_bytes, 8);
  file.read(bytes.data() + 8, n, 8);
  return parse_safetensors_header(bytes, size, path);
}

SafetensorsLayout parse_safetensors_header(std::string_view bytes, uint64_t file_size, const std::string& source) {
  require_length_field(file_size, source);
  if (bytes.size() < 8) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': {} bytes given, too short for the header length", source,
               bytes.size());
  }
  uint8_t len_bytes[8];
  std::memcpy(len_bytes, bytes.data(), 8);
  const uint64_t n = safetensors_header_length(len_bytes, file_size, source);
  if (bytes.size() - 8 < n) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': {} header bytes given of the {} the length field announces", source,
               bytes.size() - 8, n);
  }
  const std::string_view text = bytes.substr(8, n);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': the header is not JSON: {}", source, e.what());
  }
  if (!j.is_object()) ZERO_THROW(InvalidArgument, "safetensors '{}': the header is not a JSON object", source);
  SafetensorsLayout layout;
  layout.data_start = 8 + n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) ZERO_THROW(InvalidArgument, "safetensors '{}': __metadata__ is not an object", source);
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) {
          ZERO_THROW(InvalidArgument, "safetensors '{}': __metadata__ '{}' is not a string", source, m.key());
        }
        layout.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      ZERO_THROW(InvalidArgument, "safetensors '{}': tensor '{}': {}", source, name, what);
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets")) {
      bad("needs dtype, shape and data_offsets");
    }
    SafetensorsTensor t;
    t.name = name;
    const auto& dt = e["dtype"];
    const auto found = std::find_if(std::begin(kNames), std::end(kNames), [&](const DTypeName& d) {
      return dt.is_string() && dt.get<std::string>() == d.name;
    });
    if (found == std::end(kNames)) bad("unsupported dtype " + dt.dump());
    t.dtype = found->dtype;
    const auto& shape = e["shape"];
    const auto& off = e["data_offsets"];
    if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), [](const auto& d) { return d.is_number_integer(); })) {
      bad("shape is not a list of integers");
    }
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      bad("data_offsets is not [begin, end]");
    }
    for (const auto& d : shape) t.shape.push_back(d.get<int64_t>());
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    uint64_t elems = 0;
    if (!elements(t.shape, &elems) || elems > UINT64_MAX / dtype_size(t.dtype)) bad("shape is out of range");
    if (t.end < t.begin || t.end - t.begin != elems * dtype_size(t.dtype)) {
      bad(fmt::format("data_offsets [{}, {}] do not hold {} elements of {}", t.begin, t.end, elems,
                      found->name));
    }
    if (t.end > file_size - layout.data_start) {
      bad(fmt::format("data_offsets end {} is past the end of the data ({} bytes)", t.end,
                      file_size - layout.data_start));
    }
    layout.tensors.push_back(std::move(t));
  }
  std::sort(layout.tensors.begin(), layout.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t expect = 0;
  for (const SafetensorsTensor& t : layout.tensors) {
    if (t.begin != expect) {
      ZERO_THROW(InvalidArgument, "safetensors '{}': tensor '{}' starts at {} but the data before it ends at {} ({})",
                 source, t.name, t.begin, expect, t.begin > expect ? "a hole" : "an overlap");
    }
    expect = t.end;
  }
  if (layout.data_start + expect != file_size) {
    ZERO_THROW(InvalidArgument, "safetensors '{}': the tensors end at byte {} but the file has {}", source,
               layout.data_start + expect, file_size);
  }
  return layout;
}

}  // namespace zero
