#pragma once
// A checkpoint looked into without an engine (the zero_ckpt tool): what it holds, whether every
// byte is intact, and its full weights as safetensors.
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace zero {

struct CheckpointInfo {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::kFloat32;
    bool trainable = true;  // frozen parameters are saved whole, in their own dtype
  };
  struct File {
    std::string path;
    uint64_t bytes = 0;
  };
  int64_t step = 0;
  int world_size = 0, stage = 0;
  DType model_dtype = DType::kFloat32;
  std::string optimizer;
  std::vector<std::string> states;
  std::vector<Param> params;
  std::vector<File> files;
};

// The manifest and the indexes, validated (sizes, index checksums); the data is not read.
CheckpointInfo inspect_checkpoint(const std::string& dir);
// Every data file's and every piece's checksum; throws naming the file and the piece.
void verify_checkpoint(const std::string& dir);
// The full weights as safetensors: fp32 (the master) or the model dtype (the saved parameters),
// streamed tensor by tensor.
void export_checkpoint(const std::string& dir, const std::string& out, DType dtype);

}  // namespace zero
