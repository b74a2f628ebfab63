#include "base/check.h"
#include "base/error.h"
#include "zero/checkpoint/checkpoint_offline.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "memory/host_kernels.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/checkpoint_reader.h"
#include "zero/checkpoint/checkpoint_set.h"
#include "zero/checkpoint/crc32c.h"
#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/safetensors.h"

namespace zero {
namespace {

using json = nlohmann::json;

CheckpointInfo info_of(const std::string& dir, const CheckpointSet& set) {
  CheckpointInfo info;
  const CheckpointSet::Source& first = set.sources()[0];
  const json& doc = first.m.doc;
  const std::string& path = first.path;
  info.step = checkpoint_field<int64_t>(doc, "step", path);
  info.world_size = checkpoint_field<int>(doc, "world_size", path);
  info.stage = checkpoint_field<int>(doc, "stage", path);
  info.layout = saved_layout(doc, path);
  if (info.layout) info.world_size = info.layout->dp;
  if (const std::string d = checkpoint_field<std::string>(doc, "model_dtype", path); d != kCheckpointMixedDtypes) {
    info.model_dtype = parse_dtype(d);
  } else {
    info.model_dtype = std::nullopt;
  }
  const json opt = checkpoint_field<json>(doc, "optimizer", path);
  info.optimizer = checkpoint_field<std::string>(opt, "kind", path);
  info.states = checkpoint_field<std::vector<std::string>>(opt, "states", path);
  for (const CheckpointSet::Tensor& t : set.tensors()) {
    info.params.push_back({t.name, t.shape, t.dtype, t.trainable,
                           t.whole >= 0 ? "whole" : fmt::format("{} x {}", describe(t.placement), t.parts)});
  }
  for (const CheckpointSet::Source& s : set.sources()) {
    if (set.sources().size() > 1) info.parts.push_back(s.dir.substr(dir.size() + 1));
    for (size_t r = 0; r < s.m.files.size(); ++r) {
      info.files.push_back({s.m.files[r], checkpoint_field<uint64_t>(s.m.doc["files"][r], "bytes", s.path)});
    }
  }
  return info;
}

void verify_directory(const std::string& dir) {
  const Manifest m = read_manifest(dir);
  const std::string path = dir + "/manifest.json";
  std::vector<char> buf(size_t{4} << 20);
  for (size_t r = 0; r < m.files.size(); ++r) {
    const FileReader f(m.files[r]);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < f.size(); at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), f.size() - at));
      f.read(buf.data(), n, at);
      crc = crc32c(buf.data(), n, crc);
    }
    if (crc == checkpoint_field<uint32_t>(m.doc["files"][r], "crc32c", path)) continue;
    // A damaged file: its pieces' own checksums name the piece (the index itself was verified).
    PieceReader reader(m);
    for (const auto& [name, pieces] : m.pieces) {
      for (const SavedPiece& sp : pieces) {
        if (sp.file == static_cast<int>(r)) reader.verify_only(sp);
      }
    }
    for (const SavedPiece& sp : m.blobs) {
      if (sp.file == static_cast<int>(r)) reader.verify_only(sp);
    }
    checkpoint_error(m.files[r], "checksum mismatch: the file is damaged");
  }
}


}  // namespace

CheckpointInfo inspect_checkpoint(const std::string& dir) {
  return info_of(dir, CheckpointSet(checkpoint_directories(dir)));
}

void verify_checkpoint(const std::string& top) {
  for (const std::string& dir : checkpoint_directories(top)) verify_directory(dir);
}

void export_checkpoint(const std::string& dir, const std::string& out, DType dtype) {
  CheckpointSet set(checkpoint_directories(dir));
  const CheckpointInfo info = info_of(dir, set);
  const std::string& path = set.sources()[0].path;
  // fp32 comes from the master; the model dtype from the saved parameters.
  const bool from_params = dtype != DType::kFloat32;
  if (from_params && dtype != info.model_dtype) {
    checkpoint_error(path, fmt::format("export as {}: the checkpoint holds fp32 masters and {} parameters", dtype_name(dtype),
                                       info.model_dtype ? dtype_name(*info.model_dtype) : "mixed-dtype"));
  }
  SafetensorsLayout layout;
  for (const CheckpointInfo::Param& p : info.params) layout.tensors.push_back({p.name, dtype, p.shape});
  const std::string header = safetensors_header(layout);
  FileWriter f(out, FileWriter::Mode::kDirect);
  f.write(header.data(), header.size());
  std::vector<char> tensor;
  // One tensor in memory at a time, whole (its tensor-parallel parts put together); layout.tensors[i]
  // is info.params[i].
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const SafetensorsTensor& t = layout.tensors[i];
    const CheckpointInfo::Param& param = info.params[i];
    const size_t n = static_cast<size_t>((t.end - t.begin) / dtype_size(dtype));
    tensor.resize(t.end - t.begin);
    const TpPlacement whole = TpPlacement::replicated();
    if (param.trainable) {
      set.read(t.name, from_params ? kCheckpointParamsKind : kCheckpointMasterKind, whole, 1, 0, 0, n, tensor.data(), dtype);
    } else {
      // Frozen: saved whole (or in parts) in its own dtype.
      std::vector<char> saved(n * dtype_size(param.dtype));
      set.read(t.name, kCheckpointFrozenKind, whole, 1, 0, 0, n, saved.data(), param.dtype);
      memory::host_kernels::convert(saved.data(), param.dtype, tensor.data(), dtype, n);
    }
    set.clear();
    f.write(tensor.data(), tensor.size());
  }
  f.commit();
}


}  // namespace zero
