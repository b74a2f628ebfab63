// zero_ckpt: look into a checkpoint without an engine.
//
//   zero_ckpt inspect DIR                 the layout it was saved at (dp, tp, pp, stage, offload), names,
//                                         whole shapes and tensor-parallel cuts, sizes, step, files
//   zero_ckpt verify DIR                  every file's and every piece's CRC-32C
//   zero_ckpt export DIR OUT.safetensors [--dtype fp32|bf16|fp16]
//                                         the full weights, streamed tensor by tensor
//
// Exits 0 on success, 1 with the error (naming the file and the problem) on stderr otherwise.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "base/error.h"
#include "zero/checkpoint/checkpoint_offline.h"
#include "zero/param_registry.h"  // shape_numel, shape_string

namespace {

using namespace zero;

int usage() {
  std::fprintf(stderr,
               "usage: zero_ckpt inspect DIR | verify DIR | export DIR OUT.safetensors [--dtype fp32|bf16|fp16]\n");
  return 2;
}

int inspect(const std::string& dir) {
  const CheckpointInfo info = inspect_checkpoint(dir);
  uint64_t numel = 0, bytes = 0;
  // The world size is the data-parallel size; a checkpoint with a layout says the rest on its own line.
  const std::string saved_by =
      info.layout ? "" : fmt::format(", saved by {} ranks at stage {}", info.world_size, info.stage);
  std::printf("checkpoint %s\n  step %lld%s, model dtype %s, optimizer %s (", dir.c_str(), static_cast<long long>(info.step),
              saved_by.c_str(), info.model_dtype ? dtype_name(*info.model_dtype) : "mixed", info.optimizer.c_str());
  for (size_t i = 0; i < info.states.size(); ++i) std::printf("%s%s", i ? ", " : "", info.states[i].c_str());
  std::printf(")\n");
  if (info.layout) std::printf("  layout: %s\n", describe(*info.layout).c_str());
  if (!info.parts.empty()) {
    std::printf("  %zu parts (one per engine):", info.parts.size());
    for (const std::string& part : info.parts) std::printf(" %s", part.c_str());
    std::printf("\n");
  }
  std::printf("  %-40s %-20s %-6s %14s  %s\n", "parameter", "shape", "dtype", "elements", "saved as");
  for (const CheckpointInfo::Param& p : info.params) {
    const uint64_t n = shape_numel(p.shape);
    numel += n;
    std::printf("  %-40s %-20s %-6s %14llu  %s\n", p.name.c_str(), shape_string(p.shape).c_str(), dtype_name(p.dtype),
                static_cast<unsigned long long>(n), p.placement.c_str());
  }
  for (const CheckpointInfo::File& f : info.files) bytes += f.bytes;
  std::printf("  %zu parameters, %llu elements; %zu data files, %llu bytes\n", info.params.size(),
              static_cast<unsigned long long>(numel), info.files.size(), static_cast<unsigned long long>(bytes));
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.size() == 2 && args[0] == "inspect") return inspect(args[1]);
  if (args.size() == 2 && args[0] == "verify") {
    verify_checkpoint(args[1]);
    std::printf("%s: every checksum matches\n", args[1].c_str());
    return 0;
  }
  if ((args.size() == 3 || args.size() == 5) && args[0] == "export") {
    DType dtype = DType::kFloat32;
    if (args.size() == 5) {
      if (args[3] != "--dtype") return usage();
      dtype = parse_dtype(args[4]);
    }
    export_checkpoint(args[1], args[2], dtype);
    std::printf("wrote %s\n", args[2].c_str());
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_ckpt: %s\n", e.what());
    return 1;
  }
}
