#include "zero/tp_replica_check.h"

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "zero/rank_agreement.h"

namespace zero {
namespace {

// FNV-1a over the bytes: a digest to compare, not a defence against anyone.
uint64_t digest(const void* data, size_t bytes) {
  uint64_t h = 14695981039346656037ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

std::string split_without_tp_group(const ParamRegistry& registry) {
  for (const ParamSpec& p : registry.params()) {
    if (p.tp.is_split()) {
      return fmt::format("parameter '{}' is split over tensor parallelism (ParamSpec.tp = {}) but EngineComms.tp is "
                         "null: give the engine its tp group (EngineComms::from_mesh)",
                         p.name, describe(p.tp));
    }
  }
  return "";
}

void check_tp_replicas(comm::Communicator& tp, const ParamRegistry& registry, memory::Device& device,
                       std::chrono::milliseconds timeout) {
  if (tp.size() == 1 || !device.holds_values()) return;
  std::vector<AgreementEntry> entries;
  const bool host = device.kind() != memory::DeviceKind::kCuda;
  memory::Stream& compute = device.compute_stream();
  device.synchronize(compute, timeout);  // the user's writes of the initial values
  for (const ParamSpec& p : registry.params()) {
    if (p.tp.is_split()) continue;
    const size_t bytes = p.data.numel * dtype_size(p.dtype);
    uint64_t d = 0;
    if (host) {
      d = digest(p.data.ptr, bytes);
    } else {
      memory::Buffer staged = device.allocate_host_staging(bytes, memory::Category::kOther);
      device.copy(staged.data(), p.data.ptr, bytes, compute);
      device.synchronize(compute, timeout);
      d = digest(staged.data(), bytes);
    }
    entries.push_back({fmt::format("parameter '{}'", p.name), fmt::format("values of digest {:016x}", d)});
  }
  check_agreement(tp,
                  {.what = "a parameter registered replicated over tensor parallelism (every tp rank must hold the "
                           "same values; a tensor split across tp is registered with its split placement, "
                           "ParamSpec::tp = TpPlacement::split)",
                   .verb = "holds"},
                  entries, "", timeout, &device);
}

}  // namespace zero
