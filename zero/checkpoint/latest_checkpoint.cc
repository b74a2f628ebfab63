#include "zero/checkpoint/latest_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>

#include "base/error.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/checkpoint_set.h"

namespace zero {

std::optional<FoundCheckpoint> latest_checkpoint(const std::string& dir, std::vector<std::string>* passed_over) {
  std::optional<FoundCheckpoint> best;
  for (const std::string& candidate : {dir, dir + ".old"}) {
    std::error_code ec;
    if (!std::filesystem::exists(candidate, ec)) continue;
    try {
      // Reading the set checks what a load would: the manifests, the indexes and the data files' sizes.
      const CheckpointSet set(checkpoint_directories(candidate));
      const CheckpointSet::Source& first = set.sources().front();
      const auto step = checkpoint_field<int64_t>(first.m.doc, "step", first.path);
      if (!best || step > best->step) best = FoundCheckpoint{.dir = candidate, .step = step};
    } catch (const Error& e) {
      if (passed_over != nullptr) passed_over->push_back(fmt::format("'{}' is not complete: {}", candidate, e.what()));
    }
  }
  return best;
}

}  // namespace zero
