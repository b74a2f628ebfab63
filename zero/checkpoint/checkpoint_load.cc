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
#include "zero/checkpoint/checkpoint_set.h"
#include "zero/rank_agreement.h"

namespace zero {
namespace {

using json = nlohmann::json;
using namespace checkpoint_internal;

// A registered parameter against its saved tensor: the whole shape, dtype, trainable.
void check_param(const CheckpointParts& p, const ParamSpec& spec, const CheckpointSet::Tensor& saved,
                 const std::string& path) {
  const std::vector<int64_t> shape = whole_shape(p, spec);
  if (saved.shape != shape) {
    checkpoint_error(path, fmt::format("parameter '{}' has shape {} but the engine registered {}{}", spec.name,
                                       shape_string(saved.shape), shape_string(shape),
                                       tp_size(p) > 1 ? fmt::format(" (whole; its tp part is {})", shape_string(spec.shape))
                                                      : ""));
  }
  if (saved.dtype != spec.dtype) {
    checkpoint_error(path, fmt::format("parameter '{}' was saved as {} but the engine registered {}", spec.name,
                                       dtype_name(saved.dtype), dtype_name(spec.dtype)));
  }
  if (saved.trainable != spec.requires_grad) {
    checkpoint_error(path, fmt::format("parameter '{}' was saved {} but the engine registered it {}", spec.name,
                                       spec.requires_grad ? "frozen" : "trainable", spec.requires_grad ? "trainable" : "frozen"));
  }
}

// Every registered parameter saved, as registered, and the optimizer the engine runs. Returns the
// saved tensors this engine does not register (sorted): a single engine's checkpoint holding one is
// of another model; under model parallelism they are other engines' until no engine registers them.
std::vector<std::string> check_registration(const CheckpointParts& p, const CheckpointSet& set, bool same_optimizer) {
  for (const CheckpointSet::Source& s : set.sources()) {
    const json opt = checkpoint_field<json>(s.m.doc, "optimizer", s.path);
    const std::string kind = checkpoint_field<std::string>(opt, "kind", s.path);
    if (same_optimizer && kind != optim::optimizer_label(p.options->optimizer)) {
      checkpoint_error(s.path, fmt::format("saved by optimizer {} but the engine runs {} (LoadOptions::optimizer_state "
                                           "kConvert or kReset loads it anyway)",
                                           kind, optim::optimizer_label(p.options->optimizer)));
    }
  }
  const std::string& path = set.sources()[0].path;
  const bool several = set.sources().size() > 1;
  for (const ParamSpec& spec : p.registry->params()) {
    const CheckpointSet::Tensor* t = set.find(spec.name);
    if (t == nullptr) {
      checkpoint_error(path, fmt::format("has no parameter '{}'{} (a checkpoint of another model?)", spec.name,
                                         several ? ", nor has any other part of the checkpoint" : ""));
    }
    check_param(p, spec, *t, path);
  }
  std::vector<std::string> unregistered;
  for (const CheckpointSet::Tensor& t : set.tensors()) {
    if (!p.registry->find(t.name)) unregistered.push_back(t.name);
  }
  std::sort(unregistered.begin(), unregistered.end());
  return unregistered;
}

[[noreturn]] void extra_parameter(const std::string& path, const std::string& name) {
  checkpoint_error(path, fmt::format("holds parameter '{}', which the engine did not register (a checkpoint of another model?)",
                                     name));
}

// Model parallelism: a saved tensor that no engine of the job registers (each engine's unregistered
// list, intersected over the model-parallel group). Every rank computes the same verdict.
void check_no_extra(const CheckpointParts& p, const std::vector<std::string>& unregistered, const CheckpointSet& set) {
  std::vector<AgreementEntry> mine;
  for (const std::string& n : unregistered) mine.push_back({n, ""});
  std::map<std::string, int> count;
  for (const std::vector<AgreementEntry>& rank : all_gather_entries(*p.model_parallel, p.device, mine, timeout_of(p))) {
    for (const AgreementEntry& e : rank) ++count[e.key];
  }
  for (const auto& [name, n] : count) {
    if (n == p.model_parallel->size()) extra_parameter(set.sources()[set.find(name)->source(0)].path, name);
  }
}

}  // namespace

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::string& dir, const LoadOptions& options) {
  return load_checkpoint(p, std::vector<std::string>{dir}, options);
}

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::vector<std::string>& dirs, const LoadOptions& options) {
  ZERO_CHECK(!dirs.empty(), "load_checkpoint: no directory given");
  LoadedCheckpoint out;
  std::unique_ptr<CheckpointSet> set;
  std::vector<std::string> unregistered;
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
  // Elements [begin, end) of `kind` of this rank's tp part of registered parameter `spec`, from the
  // saved pieces that hold them.
  const int tp = tp_size(p), tp_r = tp_rank(p);
  auto gather = [&](const ParamSpec& spec, const std::string& kind, size_t begin, size_t end, void* into, DType dtype) {
    set->read(spec.name, kind, spec.tp, tp, tp_r, begin, end, into, dtype);
  };
  auto clear_readers = [&] { set->clear(); };
  // Pass 1: read and verify everything this rank needs before anything changes.
  agree(p, "checkpoint load", attempt([&] {
          std::vector<std::string> parts;  // a model-parallel checkpoint's directories in place of it
          for (const std::string& d : dirs) {
            for (std::string& part : checkpoint_directories(d)) parts.push_back(std::move(part));
          }
          set = std::make_unique<CheckpointSet>(parts);
          const OptimizerStateLoad how = options.optimizer_state;
          unregistered = check_registration(p, *set, how == OptimizerStateLoad::kSame);
          if (!is_model_parallel(p) && set->sources().size() == 1 && !unregistered.empty()) {
            extra_parameter(set->sources()[0].path, unregistered[0]);
          }
          // The states to read: every one the engine keeps (kSame: each must be saved), those saved
          // (kConvert), none (kReset); the others start anew.
          std::vector<std::vector<std::string>> saved;  // each source's state names
          for (const CheckpointSet::Source& s : set->sources()) {
            saved.push_back(checkpoint_field<std::vector<std::string>>(checkpoint_field<json>(s.m.doc, "optimizer", s.path),
                                                                       "states", s.path));
          }
          for (const std::string& n : state_names(p)) {
            bool saved_everywhere = how != OptimizerStateLoad::kReset;
            for (size_t i = 0; i < saved.size() && how != OptimizerStateLoad::kReset; ++i) {
              if (std::find(saved[i].begin(), saved[i].end(), n) != saved[i].end()) continue;
              if (how == OptimizerStateLoad::kSame) {
                checkpoint_error(set->sources()[i].path, fmt::format("has no optimizer state '{}'", n));
              }
              saved_everywhere = false;
            }
            (saved_everywhere ? names : out.states_reset).push_back(n);
          }
          out.states_loaded = names;
          const CheckpointSet::Source& head = set->sources()[0];
          out.optimizer =
              checkpoint_field<std::string>(checkpoint_field<json>(head.m.doc, "optimizer", head.path), "kind", head.path);
          for (const std::string& s : names) {
            direct_states.push_back(shard_optimizer(p).host_state(s));
            if (direct_states.back() == nullptr) direct_master = nullptr;
          }
          if (direct_master == nullptr) {
            master.reset(new float[numel]);
            for (size_t i = 0; i < names.size(); ++i) states.emplace_back(new float[numel]);
          }
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const ParamSpec& spec = tensor_spec(p, piece.tensor);
            gather(spec, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end,
                   master ? master.get() + piece.opt_offset : nullptr, DType::kFloat32);
            for (size_t s = 0; s < names.size(); ++s) {
              gather(spec, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                     master ? states[s].get() + piece.opt_offset : nullptr, DType::kFloat32);
            }
            clear_readers();
          }
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            std::vector<char>& bytes = frozen.emplace_back(p.registry->numel(id) * dtype_size(spec.dtype));
            gather(spec, kCheckpointFrozenKind, 0, p.registry->numel(id), bytes.data(), spec.dtype);
          }
          // The user blobs of the first directory's ranks.
          const CheckpointSet::Source& first = set->sources()[0];
          for (const SavedPiece& b : first.m.blobs) {
            const std::vector<char>& bytes = first.reader->bytes(b);
            if (out.user_blobs.size() <= static_cast<size_t>(b.file)) out.user_blobs.resize(static_cast<size_t>(b.file) + 1);
            out.user_blobs[static_cast<size_t>(b.file)].assign(bytes.begin(), bytes.end());
          }
          const std::string& path = first.path;
          const Manifest* m = &first.m;
          out.world_size = checkpoint_field<int>(m->doc, "world_size", path);
          out.stage = checkpoint_field<int>(m->doc, "stage", path);
          out.layout = saved_layout(m->doc, path);
          if (out.layout) {
            out.world_size = out.layout->dp;
            out.tp = out.layout->tp;
            out.pp = out.layout->pp;
          }
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
  // A saved tensor no engine of the job registers: every rank reaches the same verdict, so this
  // fails everywhere before anything changes.
  if (is_model_parallel(p)) check_no_extra(p, unregistered, *set);
  // Pass 2, everything verified on every rank: into the engine.
  if (direct_master != nullptr) {
    // The same pieces again (now from the page cache, their checksums checked again) straight into
    // place. Only a file changed between the passes can fail here, and it is reported.
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const ParamSpec& spec = tensor_spec(p, piece.tensor);
      gather(spec, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end, direct_master + piece.opt_offset,
             DType::kFloat32);
      for (size_t s = 0; s < names.size(); ++s) {
        gather(spec, checkpoint_state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
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
  // The states that start anew, at their initial values: zeros, but Adagrad's sum at its group's
  // initial_accumulator_value (8-bit AdamW takes a zero absmax beside nonzero moments as none given).
  if (!out.states_reset.empty()) {
    std::vector<float> initial;
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const size_t n = piece.tensor_end - piece.tensor_begin;
      const optim::Hyper& h = p.options->optimizer.groups.at(static_cast<size_t>(tensor_spec(p, piece.tensor).group));
      for (const std::string& name : out.states_reset) {
        initial.assign(n, name == "sum" ? h.initial_accumulator_value : 0.0f);
        shard_optimizer(p).write_state(name, piece.opt_offset, n, initial.data());
      }
    }
  }
  const std::vector<int> frozen_list = frozen_ids(p);
  for (size_t i = 0; i < frozen_list.size(); ++i) set_frozen(p, frozen_list[i], frozen[i]);
  p.applier->publish_master(*p.writeback);
  return out;
}

}  // namespace zero
