#include "parallel/tensor/tp_grads.h"

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "zero/collective_order.h"
#include "zero/rank_agreement.h"

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

void TpGrads::complete_held(const ParamSpec& p, void*, DType) {
  ZERO_THROW(CheckError, "TpGrads holds no gradient, yet was asked to complete '{}'", p.name);
}

}  // namespace zero::parallel
