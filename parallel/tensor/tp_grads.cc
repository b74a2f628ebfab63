#include "parallel/tensor/tp_grads.h"

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "zero/collective_order.h"
#include "zero/rank_agreement.h"
#include "zero/tp_placement.h"

namespace zero::parallel {
namespace {

// FNV-1a over the bytes: a digest to compare, not a defence against anyone.
uint64_t digest(const void* data, size_t bytes) {
  uint64_t h = 14695981039346656037ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

void TpGrads::bind(memory::Device& device, std::chrono::milliseconds timeout) {
  if (device_ != nullptr) ZERO_THROW(InvalidArgument, "the tensor-parallel gradient finalizer serves one engine; it is bound already");
  // The pairing is checked now, not at the first collective.
  CollectiveOrder check(device, tp_, timeout);
  device_ = &device;
  timeout_ = timeout;
}

void TpGrads::initial_values(const ParamRegistry& registry) {
  if (!parallel() || !device_->holds_values()) return;
  memory::Device& device = *device_;
  std::vector<AgreementEntry> entries;
  const bool host = device.kind() != memory::DeviceKind::kCuda;
  memory::Stream& compute = device.compute_stream();
  device.synchronize(compute, timeout_);  // the user's writes of the initial values
  for (const ParamSpec& p : registry.params()) {
    if (p.tp.is_split()) continue;
    const size_t bytes = p.data.numel * dtype_size(p.dtype);
    uint64_t d = 0;
    if (host) {
      d = digest(p.data.ptr, bytes);
    } else {
      memory::Buffer staged = device.allocate_host_staging(bytes, memory::Category::kOther);
      device.copy(staged.data(), p.data.ptr, bytes, compute);
      device.synchronize(compute, timeout_);
      d = digest(staged.data(), bytes);
    }
    entries.push_back({fmt::format("parameter '{}'", p.name), fmt::format("values of digest {:016x}", d)});
  }
  check_agreement(tp_,
                  {.what = "a parameter registered replicated over tensor parallelism (every tp rank must hold the "
                           "same values; a tensor split across tp is registered with its split placement, "
                           "ParamSpec::tp = TpPlacement::split)",
                   .verb = "holds"},
                  entries, "", timeout_, &device);
}

SplitTensor TpGrads::split(const ParamSpec& p) const {
  if (!parallel() || !p.tp.is_split()) return {};
  SplitTensor s;
  s.over = &tp_;
  s.whole_shape = full_shape(p.shape, p.tp, tp_.size());
  s.runs = [whole_shape = s.whole_shape, placement = p.tp, rank = tp_.rank(), t = tp_.size()](size_t begin,
                                                                                             size_t end) {
    std::vector<SplitRun> runs;
    for (const TpRun& r : part_runs(whole_shape, placement, rank, t, begin, end)) {
      runs.push_back({r.local, r.full, r.n});
    }
    return runs;
  };
  if (device_ == nullptr || device_->kind() == memory::DeviceKind::kCuda) return s;
  s.gather = [&tp = tp_, timeout = timeout_, whole_shape = s.whole_shape, placement = p.tp, name = p.name](
                 std::span<float* const> local, size_t numel, const optim::WholeTensorUpdate& update) {
    const int t = tp.size();
    const size_t whole_numel = numel * static_cast<size_t>(t);
    ZERO_CHECK(whole_numel == shape_numel(whole_shape), "'{}': a whole-tensor update of {} elements of a part, not all {}",
               name, numel, shape_numel(whole_shape) / static_cast<size_t>(t));
    std::vector<float> gathered(whole_numel);
    std::vector<std::vector<float>> whole(local.size(), std::vector<float>(whole_numel));
    std::vector<float*> arrays;
    for (size_t k = 0; k < local.size(); ++k) {
      tp.all_gather(local[k], gathered.data(), numel, DType::kFloat32)->wait(timeout);
      for (int q = 0; q < t; ++q) unshard(gathered.data() + q * numel, whole_shape, placement, q, t, whole[k].data());
      arrays.push_back(whole[k].data());
    }
    update(arrays, whole_numel);
    for (size_t k = 0; k < local.size(); ++k) shard(whole[k].data(), whole_shape, placement, tp.rank(), t, local[k]);
  };
  return s;
}

void TpGrads::complete_held(const ParamSpec& p, void*, DType) {
  ZERO_THROW(CheckError, "TpGrads holds no gradient, yet was asked to complete '{}'", p.name);
}

}  // namespace zero::parallel
