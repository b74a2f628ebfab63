#pragma once
// A checkpoint looked into without an engine (the zero_ckpt tool): what it holds, whether every
// byte is intact, and its full weights as safetensors.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "layout/layout.h"

namespace zero {

struct CheckpointInfo {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::kFloat32;
    bool trainable = true;  // frozen parameters are saved whole, in their own dtype
    std::string placement;  // "whole", or how its tensor-parallel parts were cut ("split(0) x 2")
  };
  struct File {
    std::string path;
    uint64_t bytes = 0;
  };
  int64_t step = 0;
  int world_size = 0, stage = 0;  // world_size: the data-parallel ranks
  // The layout it was saved at (nullopt for checkpoints written before the manifest recorded one:
  // tp 1, pp 1) and its directories (one per engine of a model-parallel run).
  std::optional<Layout> layout;
  std::vector<std::string> parts;
  std::optional<DType> model_dtype = DType::kFloat32;  // none: the parameters mix dtypes
  std::string optimizer;
  std::vector<std::string> states;
  std::vector<Param> params;
  std::vector<File> files;
};

// The manifest and the indexes, validated (sizes, index checksums); the data is not read. A model-
// parallel checkpoint's parameters are listed once each, whole.
CheckpointInfo inspect_checkpoint(const std::string& dir);
// Every data file's and every piece's checksum; throws naming the file and the piece.
void verify_checkpoint(const std::string& dir);
// The full weights as safetensors: fp32 (the master) or the model dtype (the saved parameters),
// streamed tensor by tensor.
void export_checkpoint(const std::string& dir, const std::string& out, DType dtype);

}  // namespace zero
