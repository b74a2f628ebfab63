// The load: two passes (read and verify everything, agree, then write into the engine), so a bad
// checkpoint leaves every engine as it was.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/error.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/checkpoint_reader.h"

namespace zero {
namespace {

using json = nlohmann::json;
using namespace checkpoint_internal;

// One saved checkpoint directory the load reads from.
struct Source {
  std::string dir, path;  // path: its manifest, which errors name
  Manifest m;
  std::unique_ptr<PieceReader> reader;
};

// A registered parameter against its saved entry: shape, dtype, trainable.
void check_param(const ParamSpec& spec, const json& saved, const std::string& path) {
  const auto shape = checkpoint_field<std::vector<int64_t>>(saved, "shape", path);
  if (shape != spec.shape) {
    checkpoint_error(path, fmt::format("parameter '{}' has shape {} but the engine registered {}", spec.name, shape_string(shape),
                                       shape_string(spec.shape)));
  }
  if (checkpoint_field<std::string>(saved, "dtype", path) != dtype_name(spec.dtype)) {
    checkpoint_error(path, fmt::format("parameter '{}' was saved as {} but the engine registered {}", spec.name,
                                       checkpoint_field<std::string>(saved, "dtype", path), dtype_name(spec.dtype)));
  }
  if (checkpoint_field<bool>(saved, "trainable", path) != spec.requires_grad) {
    checkpoint_error(path, fmt::format("parameter '{}' was saved {} but the engine registered it {}", spec.name,
                                       spec.requires_grad ? "frozen" : "trainable", spec.requires_grad ? "trainable" : "frozen"));
  }
}

// Which source each registered parameter is read from (the first that holds it), checked against
// this engine's registration and optimizer. One source must hold exactly the registered parameters
// (anything else is a checkpoint of another model). Several sources (the stages of a pipeline, each
// saved apart) together hold a model this engine has one part of: each registered parameter must be
// in one of them; the others belong to other engines.
std::map<std::string, size_t> assign_sources(const CheckpointParts& p, const std::vector<Source>& sources) {
  std::vector<std::map<std::string, json>> saved(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const Source& s = sources[i];
    for (const json& j : checkpoint_field<json>(s.m.doc, "params", s.path)) {
      saved[i][checkpoint_field<std::string>(j, "name", s.path)] = j;
    }
    const json opt = checkpoint_field<json>(s.m.doc, "optimizer", s.path);
    const std::string kind = checkpoint_field<std::string>(opt, "kind", s.path);
    if (kind != optim::optimizer_name(p.options->optimizer.kind)) {
      checkpoint_error(s.path, fmt::format("saved by optimizer {} but the engine runs {}", kind,
                                           optim::optimizer_name(p.options->optimizer.kind)));
    }
  }
  std::map<std::string, size_t> source_of;
  for (const ParamSpec& spec : p.registry->params()) {
    size_t i = 0;
    while (i < sources.size() && !saved[i].count(spec.name)) ++i;
    if (i == sources.size()) {
      checkpoint_error(sources[0].path, fmt::format("has no parameter '{}'{} (a checkpoint of another model?)", spec.name,
                                                    sources.size() > 1 ? ", nor has any other directory given" : ""));
    }
    check_param(spec, saved[i].at(spec.name), sources[i].path);
    source_of[spec.name] = i;
    saved[i].erase(spec.name);
  }
  if (sources.size() == 1 && !saved[0].empty()) {
    checkpoint_error(sources[0].path,
                     fmt::format("holds parameter '{}', which the engine did not register (a checkpoint of another model?)",
                                 saved[0].begin()->first));
  }
  return source_of;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::string& dir) {
  return load_checkpoint(p, std::vector<std::string>{dir});
}

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::vector<std::string>& dirs) {
  ZERO_CHECK(!dirs.empty(), "load_checkpoint: no directory given");
  LoadedCheckpoint out;
  std::vector<Source> sources(dirs.size());
  std::map<std::string, size_t> source_of;
  std::vector<std::string> names;
  // Where the master and the state are, when the host can write them in place (fp32 state): then the
  // first pass only checks and the second reads straight into them; otherwise the first pass reads
  // into buffers, written into the engine once every rank agreed.
  float* direct_master = p.applier->host_master();
  const size_t numel = p.ownership->numel();
  std::unique_ptr<float[]> master;  // uninitialized: every element is written (coverage is checked)
  std::vector<std::unique_ptr<float[]>> states;
  std::vector<float*> direct_states;
  std::vector<std::vector<char>> frozen;  // by frozen_ids order
  // Elements [begin, end) of `kind` of tensor `name`, from the source that holds it.
  auto gather = [&](const std::string& name, const std::string& kind, size_t begin, size_t end, void* into, DType dtype) {
    Source& s = sources[source_of.at(name)];
    gather_range(s.m, *s.reader, name, kind, begin, end, into, dtype, s.path);
  };
  auto clear_readers = [&] {
    for (Source& s : sources) s.reader->clear();
  };
  // Pass 1: read and verify everything this rank needs before anything changes.
  agree(p, "checkpoint load", attempt([&] {
          for (size_t i = 0; i < dirs.size(); ++i) {
            sources[i].dir = dirs[i];
            sources[i].path = dirs[i] + "/manifest.json";
            sources[i].m = read_manifest(dirs[i]);
            sources[i].reader = std::make_unique<PieceReader>(sources[i].m);
          }
          source_of = assign_sources(p, sources);
          names = state_names(p);
          for (const Source& s : sources) {
            const auto saved_states =
                checkpoint_field<std::vector<std::string>>(checkpoint_field<json>(s.m.doc, "optimizer", s.path), "states", s.path);
            for (const std::string& n : names) {
              if (std::find(saved_states.begin(), saved_states.end(), n) == saved_states.end()) {
                checkpoint_error(s.path, fmt::format("has no optimizer state '{}'", n));
              }
            }
            if (checkpoint_field<int64_t>(s.m.doc, "step", s.path) != checkpoint_field<int64_t>(sources[0].m.doc, "step", sources[0].path)) {
              checkpoint_error(s.path, fmt::format("was saved at step {} but '{}' at step {}",
                                                   checkpoint_field<int64_t>(s.m.doc, "step", s.path), sources[0].path,
                                                   checkpoint_field<int64_t>(sources[0].m.doc, "step", sources[0].path)));
            }
          }
          for (const std::string& s : names) {
            direct_states.push_back(shard_optimizer(p).host_state(s));
            if (direct_states.back() == nullptr) direct_master = nullptr;
          }
          if (direct_master == nullptr) {
            master.reset(new float[numel]);
            for (size_t i = 0; i < names.size(); ++i) states.emplace_back(new float[numel]);
          }
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const std::string& name = tensor_name(p, piece.tensor);
            gather(name, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end,
                   master ? master.get() + piece.opt_offset : nullptr, DType::kFloat32);
            for (size_t s = 0; s < names.size(); ++s) {
              gather(name, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                     master ? states[s].get() + piece.opt_offset : nullptr, DType::kFloat32);
            }
            clear_readers();
          }
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            std::vector<char>& bytes = frozen.emplace_back(p.registry->numel(id) * dtype_size(spec.dtype));
            gather(spec.name, kCheckpointFrozenKind, 0, p.registry->numel(id), bytes.data(), spec.dtype);
          }
          // The user blobs of the first directory's ranks.
          const Source& first = sources[0];
          for (const SavedPiece& b : first.m.blobs) {
            const std::vector<char>& bytes = first.reader->bytes(b);
            if (out.user_blobs.size() <= static_cast<size_t>(b.file)) out.user_blobs.resize(static_cast<size_t>(b.file) + 1);
            out.user_blobs[static_cast<size_t>(b.file)].assign(bytes.begin(), bytes.end());
          }
          const std::string& path = first.path;
          const Manifest* m = &first.m;
          out.world_size = checkpoint_field<int>(m->doc, "world_size", path);
          out.stage = checkpoint_field<int>(m->doc, "stage", path);
          out.state.step = checkpoint_field<int64_t>(m->doc, "step", path);
          const json& sc = m->doc["loss_scaler"];
          if (!sc.is_null()) {
            optim::LossScalerState st;
            st.scale = checkpoint_field<float>(sc, "scale", path);
            st.good_steps_since_growth = checkpoint_field<int64_t>(sc, "good_steps_since_growth", path);
            st.hysteresis_left = checkpoint_field<int>(sc, "hysteresis_left", path);
            st.skipped_steps = checkpoint_field<int64_t>(sc, "skipped_steps", path);
            st.steps = checkpoint_field<int64_t>(sc, "steps", path);
            out.state.scaler = st;
          }
        }));
  // Pass 2, everything verified on every rank: into the engine.
  if (direct_master != nullptr) {
    // The same pieces again (now from the page cache, their checksums checked again) straight into
    // place. Only a file changed between the passes can fail here, and it is reported.
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const std::string& name = tensor_name(p, piece.tensor);
      gather(name, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end, direct_master + piece.opt_offset,
             DType::kFloat32);
      for (size_t s = 0; s < names.size(); ++s) {
        gather(name, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
               direct_states[s] + piece.opt_offset, DType::kFloat32);
      }
      clear_readers();
    }
  } else {
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const size_t n = piece.tensor_end - piece.tensor_begin;
      p.applier->write_master(piece.opt_offset, n, master.get() + piece.opt_offset);
      for (size_t s = 0; s < names.size(); ++s) {
        shard_optimizer(p).write_state(names[s], piece.opt_offset, n, states[s].get() + piece.opt_offset);
      }
    }
  }
  const std::vector<int> frozen_list = frozen_ids(p);
  for (size_t i = 0; i < frozen_list.size(); ++i) set_frozen(p, frozen_list[i], frozen[i]);
  p.applier->publish_master(*p.writeback);
  return out;
}

}  // namespace zero
