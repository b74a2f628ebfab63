#pragma once
// train_gpt's settings from its flags and a --config file, checked before any rank communicates:
// the model, the data and the sampling, the learning-rate schedule, the run's layout
// (examples/layout_flags.h) and the engine's options (examples/run_flags.h). Every flag:
// docs/gpt.md.
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/fault_injection.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_model.h"
#include "examples/run_flags.h"
#include "layout/layout.h"
#include "zero/engine_options.h"

namespace zero::examples {

struct GptRun {
  GptConfig model;
  DType dtype = DType::kFloat32;  // the parameters': fp32 or bf16
  bool fp32_norms = false;        // LayerNorms and biases in fp32 beside bf16 matrices
  std::string corpus;
  int steps = 400, warmup = 20, seed = 1;
  double min_lr_ratio = 0.1;
  std::optional<int> batch;  // sequences per step (--batch), else the file's, else 16
  int val_every = 50, val_batches = 4, sample_tokens = 160, top_k = 5, log_every = 1;
  std::string metrics;  // --metrics FILE: each logged step as a JSON line (progress_log.h)
  Layout layout;             // dp 0 until the world is known
  std::string layout_source;  // what the layout came from, for its errors
  std::vector<int> pp_layers;
  std::string timeline;
  EngineOptions options;  // the layout's stage, offload and micro-batches included
  ConfigFlag config;
  RunFlags run_flags;

  // Reads every flag (unknown ones refused) and checks what can be checked before the launch.
  static GptRun read(cli::Flags& flags);
  // The layout on `world` ranks (dp resolved); where the config leaves the micro-batches to the world
  // (DeepSpeed's train_batch_size and micro batch without gradient_accumulation_steps) and no flag
  // sets them, they are inferred here, in the layout and the options. Where the job has lost ranks
  // since its launch (a restart on fewer than the first_world ranks it was launched at: zerorun
  // --max-restarts), the layout planned for first_world shrunk to this world (layout/shrink.h): the
  // same model-parallel shape and global batch; `spares` ranks past it wait as replacements.
  Layout at_world(int world, int first_world = 0);
  int spares = 0;
  // --fault PLAN[@RANK[/ATTEMPT]],... (PLAN: POINT:ACTION[:N], base/fault_injection.h): each plan
  // armed on its rank (default --fault-rank, else 0) in its attempt of the job (default 0, the first;
  // zerorun --max-restarts counts them): how the reliability tests kill a rank mid-step, and
  // another while the restarted job restores. The plan for (rank, attempt), if any: fault_for.
  struct Fault {
    fault::Plan plan;
    int rank = 0, attempt = 0;
  };
  std::vector<Fault> faults;
  const fault::Plan* fault_for(int rank, int attempt) const;
  // The global batch on `world` data-parallel ranks, checked to divide into their micro-batches.
  int global_batch(int world) const;
  bool infer_micro_batches = false;
};

}  // namespace zero::examples

namespace zero {
class Engine;
namespace comm {
class Communicator;
class Mesh;
}  // namespace comm
}  // namespace zero
