#pragma once
// Every tensor of an fp32 safetensors file (a run's export: Engine::export_safetensors, zero_ckpt
// export), by name, with its shape: what the tests that compare two runs' final weights read.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/safetensors.h"

namespace zero::testing {

struct Fp32Export {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
};

inline Fp32Export read_fp32_export(const std::string& path) {
  Fp32Export w;
  const SafetensorsLayout layout = read_safetensors_header(path);
  const FileReader f(path);
  for (const SafetensorsTensor& t : layout.tensors) {
    std::vector<float>& v = w.values[t.name];
    v.resize((t.end - t.begin) / sizeof(float));
    f.read(v.data(), t.end - t.begin, layout.data_start + t.begin);
    w.shapes[t.name] = t.shape;
  }
  return w;
}

}  // namespace zero::testing
