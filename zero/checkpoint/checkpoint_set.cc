#include "zero/checkpoint/checkpoint_set.h"

#include <filesystem>

#include "base/check.h"
#include "base/error.h"
#include "zero/checkpoint/file_io.h"
#include "zero/param_registry.h"  // shape_string

namespace zero {

using json = nlohmann::json;

std::optional<json> checkpoint_top_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!path_exists(path)) return std::nullopt;
  const Manifest m = parse_manifest(read_whole_file(path), path);
  if (!is_composite(m)) return std::nullopt;
  return m.doc;
}

std::vector<std::string> checkpoint_directories(const std::string& dir) {
  if (const std::optional<json> top = checkpoint_top_manifest(dir)) {
    std::vector<std::string> dirs;
    for (const std::string& part : checkpoint_field<std::vector<std::string>>(*top, "parts", dir + "/manifest.json")) {
      dirs.push_back(dir + "/" + part);
    }
    return dirs;
  }
  if (!path_exists(dir + "/manifest.json") && path_exists(dir + "/stage0/manifest.json")) {
    std::vector<std::string> dirs;
    for (int k = 0; path_exists(dir + "/stage" + std::to_string(k)); ++k) dirs.push_back(dir + "/stage" + std::to_string(k));
    return dirs;
  }
  return {dir};
}

CheckpointSet::CheckpointSet(const std::vector<std::string>& dirs) {
  ZERO_CHECK(!dirs.empty(), "CheckpointSet: no directory given");
  sources_.resize(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) {
    Source& s = sources_[i];
    s.dir = dirs[i];
    s.path = dirs[i] + "/manifest.json";
    s.m = read_manifest(dirs[i]);
    if (is_composite(s.m)) checkpoint_error(s.path, "is a model-parallel checkpoint's top manifest, not one of its parts");
    s.reader = std::make_unique<PieceReader>(s.m);
    const int64_t step = checkpoint_field<int64_t>(s.m.doc, "step", s.path);
    const int64_t first = checkpoint_field<int64_t>(sources_[0].m.doc, "step", sources_[0].path);
    if (step != first) {
      checkpoint_error(s.path, fmt::format("was saved at step {} but '{}' at step {} (parts of different saves)", step,
                                           sources_[0].path, first));
    }
    for (const json& j : checkpoint_field<json>(s.m.doc, "params", s.path)) {
      Tensor t;
      t.name = checkpoint_field<std::string>(j, "name", s.path);
      t.shape = checkpoint_field<std::vector<int64_t>>(j, "shape", s.path);
      t.dtype = parse_dtype(checkpoint_field<std::string>(j, "dtype", s.path));
      t.trainable = checkpoint_field<bool>(j, "trainable", s.path);
      int part = 0;
      if (j.contains("tp")) {
        const json& tp = j["tp"];
        t.parts = checkpoint_field<int>(tp, "parts", s.path);
        part = checkpoint_field<int>(tp, "part", s.path);
        t.placement = TpPlacement::split(checkpoint_field<int>(tp, "dim", s.path), checkpoint_field<int>(tp, "blocks", s.path));
        // Each directory holds one part of a tensor, so a valid checkpoint has no more parts than
        // directories (and a damaged count cannot size an allocation).
        if (t.parts < 1 || part < 0 || part >= t.parts || static_cast<size_t>(t.parts) > dirs.size()) {
          checkpoint_error(s.path, fmt::format("parameter '{}' is part {} of {} tensor-parallel parts (in {} director{})",
                                               t.name, part, t.parts, dirs.size(), dirs.size() == 1 ? "y" : "ies"));
        }
        try {
          local_shape(t.name, t.shape, t.placement, t.parts);
        } catch (const InvalidArgument& e) {
          checkpoint_error(s.path, e.what());
        }
      }
      auto [it, added] = index_.emplace(t.name, tensors_.size());
      if (added) {
        if (t.parts > 1) t.part_source.assign(static_cast<size_t>(t.parts), -1);
        tensors_.push_back(t);
      }
      Tensor& known = tensors_[it->second];
      if (known.shape != t.shape || known.dtype != t.dtype || known.trainable != t.trainable) {
        checkpoint_error(s.path, fmt::format("parameter '{}' is {} {}{} here but {} {}{} in '{}'", t.name, shape_string(t.shape),
                                             dtype_name(t.dtype), t.trainable ? "" : " (frozen)", shape_string(known.shape),
                                             dtype_name(known.dtype), known.trainable ? "" : " (frozen)",
                                             sources_[static_cast<size_t>(known.whole >= 0 ? known.whole : 0)].path));
      }
      if (t.parts == 1) {
        if (known.whole < 0) known.whole = static_cast<int>(i);
        continue;
      }
      if (known.part_source.empty()) {  // met whole first: the parts are not needed
        continue;
      }
      if (known.parts != t.parts || !(known.placement == t.placement)) {
        checkpoint_error(s.path, fmt::format("parameter '{}' is cut {} into {} parts here but {} into {} elsewhere", t.name,
                                             describe(t.placement), t.parts, describe(known.placement), known.parts));
      }
      int& src = known.part_source[static_cast<size_t>(part)];
      if (src < 0) src = static_cast<int>(i);
    }
  }
  for (const Tensor& t : tensors_) {
    if (t.whole >= 0) continue;
    for (int k = 0; k < t.parts; ++k) {
      if (t.part_source[static_cast<size_t>(k)] < 0) {
        checkpoint_error(sources_[0].path, fmt::format("has no tensor-parallel part {} of the {} of parameter '{}' in any of "
                                                       "its {} director{}", k, t.parts, t.name, sources_.size(),
                                                       sources_.size() == 1 ? "y" : "ies"));
      }
    }
  }
}

const CheckpointSet::Tensor* CheckpointSet::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void CheckpointSet::read(const std::string& name, const std::string& kind, const TpPlacement& placement, int tp,
                         int tp_rank, size_t begin, size_t end, void* out, DType dtype) {
  const Tensor* t = find(name);
  ZERO_CHECK(t != nullptr, "CheckpointSet::read: no tensor '{}'", name);
  const size_t es = dtype_size(dtype);
  for (const TpRun& want : part_runs(t->shape, placement, tp_rank, tp, begin, end)) {
    const std::vector<TpRun> saved = t->whole >= 0 ? std::vector<TpRun>{{0, want.full, want.full, want.n}}
                                                   : whole_runs(t->shape, t->placement, t->parts, want.full, want.full + want.n);
    for (const TpRun& have : saved) {
      Source& s = sources_[t->source(have.part)];
      void* into = out ? static_cast<char*>(out) + (want.local - begin + (have.full - want.full)) * es : nullptr;
      gather_range(s.m, *s.reader, name, kind, have.local, have.local + have.n, into, dtype, s.path);
    }
  }
}

void CheckpointSet::clear() {
  for (Source& s : sources_) s.reader->clear();
}

}  // namespace zero
