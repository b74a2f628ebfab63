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

// The manifest against this engine's registration and optimizer: names, shapes, dtypes, states.
void check_model(const CheckpointParts& p, const Manifest& m, const std::string& path) {
  std::map<std::string, json> saved;
  for (const json& j : checkpoint_field<json>(m.doc, "params", path)) saved[checkpoint_field<std::string>(j, "name", path)] = j;
  for (const ParamSpec& spec : p.registry->params()) {
    const auto it = saved.find(spec.name);
    if (it == saved.end()) checkpoint_error(path, fmt::format("has no parameter '{}' (a checkpoint of another model?)", spec.name));
    const auto shape = checkpoint_field<std::vector<int64_t>>(it->second, "shape", path);
    if (shape != spec.shape) {
      checkpoint_error(path, fmt::format("parameter '{}' has shape {} but the engine registered {}", spec.name, shape_string(shape),
                            shape_string(spec.shape)));
    }
    if (checkpoint_field<std::string>(it->second, "dtype", path) != dtype_name(spec.dtype)) {
      checkpoint_error(path, fmt::format("parameter '{}' was saved as {} but the engine registered {}", spec.name,
                            checkpoint_field<std::string>(it->second, "dtype", path), dtype_name(spec.dtype)));
    }
    if (checkpoint_field<bool>(it->second, "trainable", path) != spec.requires_grad) {
      checkpoint_error(path, fmt::format("parameter '{}' was saved {} but the engine registered it {}", spec.name,
                            spec.requires_grad ? "frozen" : "trainable", spec.requires_grad ? "trainable" : "frozen"));
    }
    saved.erase(it);
  }
  if (!saved.empty()) {
    checkpoint_error(path, fmt::format("holds parameter '{}', which the engine did not register (a checkpoint of another model?)",
                          saved.begin()->first));
  }
  const json opt = checkpoint_field<json>(m.doc, "optimizer", path);
  const std::string kind = checkpoint_field<std::string>(opt, "kind", path);
  if (kind != optim::optimizer_name(p.options->optimizer.kind)) {
    checkpoint_error(path, fmt::format("saved by optimizer {} but the engine runs {}", kind,
                          optim::optimizer_name(p.options->optimizer.kind)));
  }
}

}  // namespace

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::string& dir) {
  LoadedCheckpoint out;
  std::optional<Manifest> m;
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
  const std::string path = dir + "/manifest.json";
  // Pass 1: read and verify everything this rank needs before anything changes.
  agree(p, "checkpoint load", attempt([&] {
          m = read_manifest(dir);
          check_model(p, *m, path);
          names = state_names(p);
          const auto saved_states = checkpoint_field<std::vector<std::string>>(checkpoint_field<json>(m->doc, "optimizer", path), "states", path);
          for (const std::string& s : names) {
            if (std::find(saved_states.begin(), saved_states.end(), s) == saved_states.end()) {
              checkpoint_error(path, fmt::format("has no optimizer state '{}'", s));
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
          PieceReader reader(*m);
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const std::string& name = tensor_name(p, piece.tensor);
            gather_range(*m, reader, name, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end,
                         master ? master.get() + piece.opt_offset : nullptr, DType::kFloat32, path);
            for (size_t s = 0; s < names.size(); ++s) {
              gather_range(*m, reader, name, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                           master ? states[s].get() + piece.opt_offset : nullptr, DType::kFloat32, path);
            }
            reader.clear();
          }
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            std::vector<char>& bytes = frozen.emplace_back(p.registry->numel(id) * dtype_size(spec.dtype));
            gather_range(*m, reader, spec.name, kCheckpointFrozenKind, 0, p.registry->numel(id), bytes.data(), spec.dtype, path);
          }
          for (const SavedPiece& b : m->blobs) {
            const std::vector<char>& bytes = reader.bytes(b);
            if (out.user_blobs.size() <= static_cast<size_t>(b.file)) out.user_blobs.resize(static_cast<size_t>(b.file) + 1);
            out.user_blobs[static_cast<size_t>(b.file)].assign(bytes.begin(), bytes.end());
          }
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
    PieceReader reader(*m);
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const std::string& name = tensor_name(p, piece.tensor);
      gather_range(*m, reader, name, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end, direct_master + piece.opt_offset,
                   DType::kFloat32, path);
      for (size_t s = 0; s < names.size(); ++s) {
        gather_range(*m, reader, name, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                     direct_states[s] + piece.opt_offset, DType::kFloat32, path);
      }
      reader.clear();
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
