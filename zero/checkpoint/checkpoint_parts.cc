#include "zero/checkpoint/checkpoint_parts.h"

#include "base/check.h"
#include "base/error.h"
#include "zero/rank_agreement.h"

namespace zero::checkpoint_internal {

int global_rank(const CheckpointParts& p) {
  return p.replica ? p.replica->rank() * p.shard->size() + p.shard->rank() : p.shard->rank();
}
int world_size(const CheckpointParts& p) { return p.shard->size() * (p.replica ? p.replica->size() : 1); }
int tp_size(const CheckpointParts& p) { return p.tp ? p.tp->size() : 1; }
int tp_rank(const CheckpointParts& p) { return p.tp ? p.tp->rank() : 0; }
bool is_model_parallel(const CheckpointParts& p) { return p.model_parallel && p.model_parallel->size() > 1; }
std::vector<int64_t> whole_shape(const CheckpointParts& p, const ParamSpec& spec) {
  return full_shape(spec.shape, spec.tp, tp_size(p));
}
std::chrono::milliseconds timeout_of(const CheckpointParts& p) { return p.options->timeout; }

const ParamSpec& tensor_spec(const CheckpointParts& p, size_t t) { return p.registry->param((*p.tensor_param)[t]); }
const std::string& tensor_name(const CheckpointParts& p, size_t t) { return tensor_spec(p, t).name; }

std::vector<int> frozen_ids(const CheckpointParts& p) {
  std::vector<int> ids;
  for (size_t i = 0; i < p.registry->params().size(); ++i) {
    if (!p.registry->params()[i].requires_grad) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

// A frozen parameter's values (the user's storage, on the engine's device) copied to the host.
std::vector<char> frozen_bytes(const CheckpointParts& p, int id) {
  const ParamSpec& spec = p.registry->param(id);
  std::vector<char> out(p.registry->numel(id) * dtype_size(spec.dtype));
  memory::Stream& compute = p.device->compute_stream();
  p.device->copy(out.data(), spec.data.ptr, out.size(), compute);
  p.device->synchronize(compute, timeout_of(p));
  return out;
}

void set_frozen(const CheckpointParts& p, int id, const std::vector<char>& bytes) {
  memory::Stream& compute = p.device->compute_stream();
  p.device->copy(p.registry->param(id).data.ptr, bytes.data(), bytes.size(), compute);
  p.device->synchronize(compute, timeout_of(p));
}

bool saves(const CheckpointParts& p, const ParamSpec& spec) { return tp_rank(p) == 0 || spec.tp.is_split(); }

// Replicas hold the same pieces: the first replica writes them. Replicated ownership (stage 0): every
// rank owns everything, so the buckets are dealt out round robin.
bool writes(const CheckpointParts& p, const OwnedPiece& piece) {
  if (p.replica && p.replica->rank() != 0) return false;
  if (!saves(p, tensor_spec(p, piece.tensor))) return false;
  if (p.ownership->is_replicated()) return static_cast<int>(piece.bucket % p.shard->size()) == p.shard->rank();
  return true;
}

// Collective over every rank: each rank's error (or "") becomes the same exception everywhere.
void agree(const CheckpointParts& p, const std::string& what, std::string error) {
  const AgreementSubject subject{what, "has"};
  try {
    check_agreement(*p.shard, subject, {}, error, timeout_of(p), p.device);
  } catch (const InvalidArgument& e) {
    error = e.what();
  }
  for (comm::Communicator* c : {p.replica, is_model_parallel(p) ? p.model_parallel : nullptr}) {
    if (c == nullptr) continue;
    try {
      check_agreement(*c, subject, {}, error, timeout_of(p), p.device);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  if (!error.empty()) throw IoError(error);
}

std::vector<std::string> state_names(const CheckpointParts& p) { return p.applier->optimizer().state_names(); }

ShardOptimizer& shard_optimizer(const CheckpointParts& p) { return p.applier->optimizer(); }

}  // namespace zero::checkpoint_internal
