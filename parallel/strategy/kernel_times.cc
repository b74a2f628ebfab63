#include "parallel/strategy/kernel_times.h"

#include <fmt/format.h>

namespace zero::strategy {
namespace {

constexpr KernelPass kPasses[] = {KernelPass::kForward, KernelPass::kInput, KernelPass::kWeight};

// Ranks per core when a layout has more ranks than a shared-core machine has cores; else 0.
double crowding(const Layout& l, const Cluster& cluster) {
  const double per_core = static_cast<double>(l.world()) / cluster.devices();
  return cluster.shared_cores && per_core > 1 ? per_core : 0.0;
}

Kernel kernel_at(const std::string& model, KernelLayer layer, KernelPass pass, int batch, const Layout& l) {
  return {model, layer, pass, batch, l.tp, l.sequence_parallel};
}

}  // namespace

const char* kernel_layer_name(KernelLayer layer) {
  static const char* names[] = {"embedding", "block", "head"};
  return names[static_cast<int>(layer)];
}

std::string kernel_key(const Kernel& k) {
  static const char* passes[] = {"f", "b", "w"};
  return fmt::format("{}/{}/b{}/tp{}/sp{}/{}", k.model, kernel_layer_name(k.layer), k.batch, k.tp,
                     k.sequence_parallel ? 1 : 0, passes[static_cast<int>(k.pass)]);
}

std::string with_collectives_key(const Kernel& k) { return kernel_key(k) + "+tp"; }

std::string crowded_key(const Kernel& k, int ranks) { return fmt::format("{}@{}", with_collectives_key(k), ranks); }

std::string alone_key(const Kernel& k) {
  Kernel one = k;
  one.tp = 1;
  one.sequence_parallel = false;
  return kernel_key(one) + "+alone";
}

KernelTiming kernel_timing(const Cluster& cluster, const std::string& model, KernelLayer layer, int batch,
                           const Layout& l) {
  if (model.empty() || l.tp == 1) return KernelTiming::kCompute;
  auto all_passes = [&](auto key) {
    for (KernelPass pass : kPasses) {
      if (!cluster.kernels.count(key(kernel_at(model, layer, pass, batch, l)))) return false;
    }
    return true;
  };
  if (crowding(l, cluster) > 0 && all_passes([&](const Kernel& k) { return crowded_key(k, l.world()); })) {
    return KernelTiming::kCrowded;
  }
  if (all_passes([](const Kernel& k) { return with_collectives_key(k); })) return KernelTiming::kWithCollectives;
  return KernelTiming::kCompute;
}

std::optional<double> kernel_seconds(const Cluster& cluster, const std::string& model, KernelLayer layer,
                                     KernelPass pass, int batch, const Layout& l) {
  if (model.empty()) return std::nullopt;
  const Kernel k = kernel_at(model, layer, pass, batch, l);
  auto find = [&](const std::string& key) -> std::optional<double> {
    const auto it = cluster.kernels.find(key);
    if (it == cluster.kernels.end()) return std::nullopt;
    return it->second;
  };
  if (cluster.shared_cores && l.world() == 1) {
    if (const std::optional<double> alone = find(alone_key(k))) return alone;
  }
  switch (kernel_timing(cluster, model, layer, batch, l)) {
    case KernelTiming::kCrowded:
      return *find(crowded_key(k, l.world())) / crowding(l, cluster);
    case KernelTiming::kWithCollectives:
      return find(with_collectives_key(k));
    case KernelTiming::kCompute:
      break;
  }
  return find(kernel_key(k));
}

}  // namespace zero::strategy
