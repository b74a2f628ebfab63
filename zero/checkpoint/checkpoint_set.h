#pragma once
// A checkpoint as the set of directories that hold it, and its tensors wherever they lie. A run
// without model parallelism saves one directory; a model-parallel run saves one directory per engine
// (per (tp, pp) coordinate) under a top manifest, and each engine holds some tensors whole and others
// as one tensor-parallel part. CheckpointSet reads any element range of any tp part of a tensor, at
// any tp and placement, from the saved parts that hold it: the wanted range becomes runs of the whole
// tensor (part_runs), each run the saved parts' ranges (whole_runs), each of those the saved pieces.
// So a checkpoint moves between (dp, tp, pp, stage) layouts with no offline step, and every rank reads
// only the bytes it now owns. It knows nothing of an engine (the load and zero_ckpt share it).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/checkpoint_reader.h"
#include "zero/tp_placement.h"

namespace zero {

// The directories that hold the checkpoint in `dir`: the parts its top manifest lists (a model-
// parallel checkpoint; their steps must be the top's), `dir` itself, or a pipelined run's
// dir/stage0, dir/stage1, ... of the earlier layout. Errors as read_manifest's.
std::vector<std::string> checkpoint_directories(const std::string& dir);

// The top manifest of a model-parallel checkpoint in `dir` (its layout and parts), if it is one.
std::optional<nlohmann::json> checkpoint_top_manifest(const std::string& dir);

class CheckpointSet {
 public:
  struct Source {
    std::string dir, path;  // path: its manifest, which errors name
    Manifest m;
    std::unique_ptr<PieceReader> reader;
  };
  // A saved tensor: whole (in `whole`, the first source that holds it whole) or in `parts` tensor-
  // parallel parts cut by `placement` (part k in source part_source[k]).
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;  // the whole tensor's
    DType dtype = DType::kFloat32;
    bool trainable = true;
    int whole = -1;
    TpPlacement placement;
    int parts = 1;
    std::vector<int> part_source;
    // The index of the source that holds tp part `part` (any part: the whole tensor's).
    size_t source(int part) const { return static_cast<size_t>(whole >= 0 ? whole : part_source[static_cast<size_t>(part)]); }
  };

  // Reads and checks every directory's manifest and indexes; a tensor saved in parts must have all
  // of them, and every directory the same step. Errors name the manifest and the tensor.
  explicit CheckpointSet(const std::vector<std::string>& dirs);

  const std::vector<Source>& sources() const { return sources_; }
  // In the order first met (directory order, then each one's registration order).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;

  // Fills out[0, end - begin) (elements of `dtype`) with elements [begin, end) of kind `kind` of tp
  // rank `tp_rank`'s part (of `tp`, cut by `placement`) of tensor `name`; out == nullptr only checks
  // that they are all there and intact. The caller checked the tensor's shape.
  void read(const std::string& name, const std::string& kind, const TpPlacement& placement, int tp, int tp_rank,
            size_t begin, size_t end, void* out, DType dtype);
  void clear();  // drops the pieces kept by partial reads

 private:
  std::vector<Source> sources_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace zero
