#pragma once
// The flags every training example shares, and what they do to the engine and the loop:
//   --offload / --offload-params      EngineOptions.offload (the optimizer; at stage 3 the parameters too)
//   --save DIR [--save-every K]       an async checkpoint every K steps and at the end
//   --resume DIR                      load DIR (any world size and stage) before the first step
//   --export FILE.safetensors         the final weights
#include <cstdio>
#include <string>

#include "examples/flags.h"
#include "zero/engine.h"

namespace zero::examples {

struct RunFlags {
  bool offload = false, offload_params = false;
  std::string save_dir, resume_dir, export_path;
  int save_every = 0;

  static RunFlags read(Flags& flags) {
    RunFlags f;
    f.offload = flags.get_bool("offload", false);
    f.offload_params = flags.get_bool("offload-params", false);
    f.save_dir = flags.get("save", "");
    f.save_every = flags.get_int("save-every", 0);
    f.resume_dir = flags.get("resume", "");
    f.export_path = flags.get("export", "");
    return f;
  }
  void apply(EngineOptions& opt) const {
    opt.offload.optimizer = offload || offload_params;
    opt.offload.params = offload_params;
  }
  // Loads --resume (if given) and returns the step to start from.
  int resume(Engine& engine) const {
    if (resume_dir.empty()) return 0;
    const LoadedCheckpoint c = engine.load(resume_dir);
    if (engine.rank() == 0) {
      std::printf("resumed from %s at step %lld (saved by %d rank(s) at stage %d)\n", resume_dir.c_str(),
                  static_cast<long long>(c.state.step), c.world_size, c.stage);
    }
    return static_cast<int>(c.state.step);
  }
  // After step `done` (1-based) of `steps`: the periodic and the final checkpoint.
  void after_step(Engine& engine, int done, int steps, std::string_view blob = {}) const {
    if (save_dir.empty()) return;
    if ((save_every > 0 && done % save_every == 0) || done == steps) engine.save_async(save_dir, blob);
  }
  // After the loop: waits for the last save, exports.
  void finish(Engine& engine) const {
    engine.wait_for_save();
    if (!save_dir.empty() && engine.rank() == 0) std::printf("checkpoint in %s\n", save_dir.c_str());
    if (export_path.empty()) return;
    engine.export_safetensors(export_path);
    if (engine.rank() == 0) std::printf("weights exported to %s\n", export_path.c_str());
  }
};

}  // namespace zero::examples
