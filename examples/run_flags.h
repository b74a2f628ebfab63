#pragma once
// The flags every training example shares, and what they do to the engine and the loop:
//   --config FILE                     EngineOptions, the model dtype and the loop's batch and log
//                                     interval from a JSON file, ours or DeepSpeed's (docs/config.md)
//   --save DIR [--save-every K]       an async checkpoint every K steps and at the end
//   --save-memory DIR --save-memory-every K  also an async checkpoint every K steps into DIR in the
//                                     node's memory (tmpfs, /dev/shm): cheap enough to take often, and
//                                     kept when the job's processes restart; the newest of the two is
//                                     what --resume auto loads. With one engine (no tp or pp) each
//                                     node keeps DIR/node-<node>, and each rank's data file is copied
//                                     to a rank of the next node (zero/checkpoint/node_copies.h), so
//                                     losing a node loses none of it; while memory checkpoints are
//                                     taken, a --save that fails (a full or read-only disk) is
//                                     reported and the run goes on
//   --resume DIR                      load DIR before the first step: saved at any (dp, tp, pp), split of
//                                     the layers and stage; "auto": the newest complete checkpoint the
//                                     --save and --save-memory directories hold
//                                     (zero/checkpoint/latest_checkpoint.h), if any: how a job that
//                                     zerorun --max-restarts starts again resumes
//   --resume-optimizer same|convert|reset  where DIR's optimizer is not this run's: refuse (same), read
//                                     each state of the same name (convert), or start the state anew
//                                     (reset) (LoadOptions, zero/checkpoint/checkpoint_types.h)
//   --export FILE.safetensors         the final weights
//   --shard-group-size N              hybrid sharding: the engine on comm::HybridGroups of N ranks
//   --optimizer NAME                  adamw, adam, sgd, adagrad, lion, muon (with AdamW: docs/optim.md),
//                                     adamw8bit, adafactor, adabelief or lamb (a user's own rules:
//                                     examples/adabelief.h; examples/lamb.h, with whole-tensor ownership)
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/hybrid_groups.h"
#include "examples/adabelief.h"
#include "examples/lamb.h"
#include "examples/optimizer_groups.h"
#include "tools/cli/flags.h"
#include "parallel/strategy/described_model.h"  // two_optimizer_groups
#include "zero/checkpoint/latest_checkpoint.h"
#include "zero/checkpoint/node_copies.h"
#include "zero/config/engine_config.h"
#include "zero/engine.h"

namespace zero::examples {

// --config FILE. The file replaces the example's built-in defaults (a key it leaves out has
// EngineOptions' default, not the example's), and a flag given on the command line overrides the
// file, so a run can start from a shared config and change one thing.
struct ConfigFlag {
  std::optional<EngineConfig> config;

  static ConfigFlag read(cli::Flags& flags) {
    ConfigFlag f;
    const std::string path = flags.get("config", "");
    if (!path.empty()) f.config = load_engine_config(path);
    return f;
  }

  // The file's options, or the example's without --config, in two optimizer groups (above); then
  // the engine flags both examples have, each only when given.
  EngineOptions engine_options(cli::Flags& flags, const EngineOptions& example_defaults, const char* program) const {
    EngineOptions o = config ? config->engine : example_defaults;
    strategy::two_optimizer_groups(o, config ? config->source : "the example's options", program);
    std::vector<optim::Hyper>& groups = o.optimizer.groups;
    o.micro_batches = flags.get_int("micro-steps", o.micro_batches);
    o.deterministic = flags.get_bool("deterministic", o.deterministic);
    // Floats only when given: the flag's fallback would go through text and lose digits.
    if (flags.has("max-grad-norm")) o.max_grad_norm = static_cast<float>(flags.get_double("max-grad-norm", 0));
    if (flags.has("lr")) {
      const float lr = static_cast<float>(flags.get_double("lr", 0));
      for (optim::Hyper& g : groups) g.lr = lr;
    }
    if (flags.has("optimizer")) {
      const std::string name = flags.get("optimizer", "");
      o.optimizer.custom = nullptr;
      if (name == "adabelief") {
        o.optimizer.custom = std::make_shared<AdaBelief>();
      } else if (name == "lamb") {
        o.optimizer.custom = std::make_shared<Lamb>();
        o.layout.whole_tensors = true;  // LAMB's trust ratio needs each tensor whole
      } else if (name == "muon") {
        add_muon_group(o);  // the hidden matrices in Muon, the rest in AdamW (examples/optimizer_groups.h)
      } else if (name == "adamw" || name == "adam" || name == "sgd" || name == "adagrad" || name == "lion" ||
                 name == "adamw8bit" || name == "adafactor") {
        o.optimizer.kind = optim::parse_optimizer(name);
      } else {
        ZERO_THROW(InvalidArgument,
                   "--optimizer: unknown optimizer '{}' (adamw, adam, sgd, adagrad, lion, muon, adamw8bit, adafactor, "
                   "adabelief or lamb)",
                   name);
      }
    }
    return o;
  }

  std::optional<DType> model_dtype() const { return config ? config->model_dtype : std::nullopt; }

  // --log-every: steps between progress lines (the file's loop.log_every, else every step).
  int log_every(cli::Flags& flags) const {
    const int every = flags.get_int("log-every", config && config->loop.log_every ? *config->loop.log_every : 1);
    if (every < 1) ZERO_THROW(InvalidArgument, "--log-every must be >= 1, got {}", every);
    return every;
  }

  // The file's global batch (samples per optimizer step) by DeepSpeed's rule, if it gives one.
  std::optional<int> global_batch(int micro_batches, int world_size) const {
    if (!config) return std::nullopt;
    try {
      return resolve_global_batch(config->loop, micro_batches, world_size);
    } catch (const InvalidArgument& e) {
      ZERO_THROW(InvalidArgument, "{}: {}", config->source, e.what());
    }
  }

  // Rank 0: which file, and the keys it holds that change nothing here.
  void print(int rank) const {
    if (!config || rank != 0) return;
    std::printf("config: %s\n", config->source.c_str());
    for (const std::string& note : config->notes) std::printf("config: %s\n", note.c_str());
  }
};

// --shard-group-size N, or the file's parallel.shard: hybrid sharding (docs/config.md), for a program
// without a mesh (train_gpt's mesh splits its own from the layout). The
// engine then runs on the shard and replica groups instead of the world.
struct HybridFlag {
  std::optional<int> shard_group_size;

  // `opt`: the options the engine will get; a shard group size needs a sharded stage. The file's
  // config was checked for that already, but --stage may have changed it since.
  static HybridFlag read(cli::Flags& flags, const ConfigFlag& config, const EngineOptions& opt) {
    HybridFlag f;
    if (config.config && config.config->layout.shard != 0) f.shard_group_size = config.config->layout.shard;
    if (flags.has("shard-group-size")) f.shard_group_size = flags.get_int("shard-group-size", 0);
    if (!f.shard_group_size) return f;
    const std::string from = flags.has("shard-group-size") ? "--shard-group-size"
                                                           : "parallel.shard of " + config.config->source;
    if (*f.shard_group_size < 1) ZERO_THROW(InvalidArgument, "{} must be >= 1, got {}", from, *f.shard_group_size);
    if (opt.stage == 0) {
      ZERO_THROW(InvalidArgument, "{} = {} needs a sharded stage (1, 2 or 3); stage 0 shards nothing", from,
                 *f.shard_group_size);
    }
    return f;
  }

  // Collective over `world`: the hybrid groups (rank 0 prints their layout), or nullptr without a
  // shard group size. They must outlive the engine that runs on them.
  std::unique_ptr<comm::HybridGroups> groups(comm::Communicator& world) const {
    if (!shard_group_size) return nullptr;
    auto g = std::make_unique<comm::HybridGroups>(world, *shard_group_size);
    if (world.rank() == 0) std::printf("hybrid sharding: %s\n", g->layout().c_str());
    return g;
  }
};

// The engine's communicators: the hybrid groups' pair, or the whole world without them.
inline EngineComms engine_comms(comm::Communicator& world, const comm::HybridGroups* groups) {
  if (groups == nullptr) return EngineComms{.shard = &world};
  return EngineComms{.shard = groups->shard(), .replica = groups->replica()};
}

// --save-memory's directory must be in memory: its parent on tmpfs (/dev/shm on Linux), else named.
inline void require_in_memory(const std::string& dir) {
  const std::string parent = std::filesystem::absolute(dir).parent_path().string();
  struct statfs fs {};
  if (::statfs(parent.c_str(), &fs) != 0) {
    ZERO_THROW(InvalidArgument, "--save-memory {}: cannot look at '{}': {}", dir, parent, std::strerror(errno));
  }
  if (static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC) {
    ZERO_THROW(InvalidArgument, "--save-memory {}: '{}' is not in memory (not tmpfs); use a directory under /dev/shm", dir,
               parent);
  }
}

// --save-memory on the nodes of one engine: this node's directory, and the copies' communicator
// and node map (zero/checkpoint/node_copies.h).
struct MemoryOnNodes {
  std::unique_ptr<comm::Communicator> comm;  // the engine's ranks, rank for rank; the saves' copies alone use it
  NodeCopies copies;
  std::string dir;  // DIR/node-<node>
};

// The checkpoint flags (--save, --save-every, --save-memory, --resume, --export) and what they do around
// the loop.
// (--stage, --offload and --offload-params are the layout's: examples/layout_flags.h.)
struct RunFlags {
  std::string save_dir, resume_dir, export_path;
  int save_every = 0;
  std::string memory_dir;
  int memory_every = 0;
  LoadOptions load;
  std::shared_ptr<MemoryOnNodes> nodes;  // use_nodes()
  // The saves into --save DIR: whether one is in flight (a failure a memory tier outlives), and
  // whether the last one failed.
  struct FileSaves {
    bool in_flight = false, last_failed = false;
  };
  std::shared_ptr<FileSaves> file_saves = std::make_shared<FileSaves>();

  static RunFlags read(cli::Flags& flags) {
    RunFlags f;
    f.save_dir = flags.get("save", "");
    f.save_every = flags.get_int("save-every", 0);
    f.resume_dir = flags.get("resume", "");
    f.export_path = flags.get("export", "");
    const std::string how = flags.get("resume-optimizer", "same");
    f.memory_dir = flags.get("save-memory", "");
    f.memory_every = flags.get_int("save-memory-every", 0);
    if (!f.memory_dir.empty()) {
      if (f.memory_every < 1) ZERO_THROW(InvalidArgument, "--save-memory {} needs --save-memory-every K >= 1", f.memory_dir);
      require_in_memory(f.memory_dir);
    }
    if (f.resume_dir == "auto" && f.save_dir.empty() && f.memory_dir.empty()) {
      ZERO_THROW(InvalidArgument, "--resume auto resumes from what --save DIR (or --save-memory DIR) holds: it needs one");
    }
    if (how == "convert") {
      f.load.optimizer_state = OptimizerStateLoad::kConvert;
    } else if (how == "reset") {
      f.load.optimizer_state = OptimizerStateLoad::kReset;
    } else if (how != "same") {
      ZERO_THROW(InvalidArgument, "--resume-optimizer '{}': expected same, convert or reset", how);
    }
    return f;
  }
  // Once the engine is built, with --save-memory: where the engine is the job's only one (no tensor
  // or pipeline parallelism), each node's memory checkpoints go to DIR/node-<node>, each rank's data
  // file copied to a rank of the next node. Collective over `engine_ranks`, which holds the engine's
  // ranks (Engine::rank()). Otherwise (tp or pp) DIR is one directory every rank must see: the job
  // must be on one node, else named here rather than at the first save's timeout.
  void use_nodes(Engine& engine, comm::Communicator& engine_ranks, int node, bool one_engine) {
    if (memory_dir.empty()) return;
    if (!one_engine) {
      const std::vector<int> node_of_rank = gather_nodes(engine_ranks, node, engine.options().timeout);
      for (size_t r = 0; r < node_of_rank.size(); ++r) {
        if (node_of_rank[r] != node_of_rank[0]) {
          ZERO_THROW(InvalidArgument, "--save-memory {}: ranks 0 and {} are on different nodes ({} and {}), and with "
                     "tensor or pipeline parallelism the memory checkpoint has no copies on other nodes: use --save "
                     "alone, or one node",
                     memory_dir, r, node_of_rank[0], node_of_rank[r]);
        }
      }
      return;
    }
    auto m = std::make_shared<MemoryOnNodes>();
    m->comm = engine_ranks.split(0, engine.rank());
    // By the engine's rank (the split's order), which under hybrid sharding is not the world's.
    m->copies = NodeCopies{.comm = m->comm.get(), .node_of_rank = gather_nodes(*m->comm, node, engine.options().timeout)};
    m->dir = memory_dir + "/node-" + std::to_string(node);
    nodes = std::move(m);
  }
  // Loads --resume (if given) and returns the step to start from. `report`: this rank prints (by
  // default the engine's rank 0; under model parallelism the caller picks one of the engines).
  int resume(Engine& engine, std::optional<bool> report = std::nullopt) const {
    if (resume_dir.empty()) return 0;
    const bool says = report.value_or(engine.rank() == 0);
    std::string dir = resume_dir;
    if (dir == "auto") {
      // Every rank looks at the same files, which no save is writing yet. The newer of the two
      // places; the files where both hold the same step.
      std::vector<std::string> passed_over;
      std::optional<FoundCheckpoint> found;
      for (const std::string& place : {save_dir, memory_dir}) {
        if (place.empty()) continue;
        // The nodes' memory: collective, it brings this node's directory up to the newest save the
        // nodes hold between them.
        const std::optional<FoundCheckpoint> here =
            place == memory_dir && nodes ? restore_node_copies(*nodes->comm, nodes->copies.node_of_rank, nodes->dir,
                                                               engine.options().timeout, &passed_over)
                                         : latest_checkpoint(place, &passed_over);
        if (here && (!found || here->step > found->step)) found = here;
      }
      if (says) {
        for (const std::string& why : passed_over) std::printf("--resume auto: passed over %s\n", why.c_str());
      }
      if (!found) {
        if (says) std::printf("--resume auto: no complete checkpoint yet; starting at step 0\n");
        return 0;
      }
      dir = found->dir;
    }
    const LoadedCheckpoint c = engine.load(dir, load);
    if (says) {
      const std::string saved_at = c.layout ? describe(*c.layout)
                                            : fmt::format("dp {} x tp {} x pp {}, stage {}", c.world_size, c.tp, c.pp, c.stage);
      std::printf("resumed from %s at step %lld (saved at %s)\n", dir.c_str(), static_cast<long long>(c.state.step),
                  saved_at.c_str());
      const std::string runs = optim::optimizer_label(engine.options().optimizer);
      if (c.optimizer != runs || !c.states_reset.empty()) {
        std::printf("optimizer state of %s into %s: read %s; started anew: %s\n", c.optimizer.c_str(), runs.c_str(),
                    c.states_loaded.empty() ? "none" : fmt::format("{}", fmt::join(c.states_loaded, ", ")).c_str(),
                    c.states_reset.empty() ? "none" : fmt::format("{}", fmt::join(c.states_reset, ", ")).c_str());
      }
    }
    return static_cast<int>(c.state.step);
  }
  // After step `done` (1-based) of `steps`: the periodic and the final checkpoint.
  void after_step(Engine& engine, int done, int steps, std::string_view blob = {}) const {
    const bool files = !save_dir.empty() && ((save_every > 0 && done % save_every == 0) || done == steps);
    const bool memory = !memory_dir.empty() && done % memory_every == 0;
    if (!files && !memory) return;
    settle(engine);
    if (files) {
      try {
        engine.save_async(save_dir, blob);
        file_saves->in_flight = true;
        return;
      } catch (const IoError& e) {
        outlive(engine, e);  // the directory could not even be prepared: the memory takes the step
      }
    }
    if (!memory) return;
    engine.save_async(nodes ? nodes->dir : memory_dir, blob, nodes ? &nodes->copies : nullptr);
  }
  // After the loop: waits for the last save, exports.
  void finish(Engine& engine, std::optional<bool> report = std::nullopt) const {
    const bool says = report.value_or(engine.rank() == 0);
    settle(engine);
    const bool files_done = !save_dir.empty() && !file_saves->last_failed;
    if (!save_dir.empty() && says) {
      std::printf(files_done ? "checkpoint in %s\n" : "no checkpoint of the end in %s (its save failed)\n", save_dir.c_str());
    }
    if (files_done && !memory_dir.empty()) {
      // The files hold the end: the copies in memory have served and would hold the nodes' memory.
      // Each node's first rank removes its own; rank 0 the directory, once empty.
      std::error_code ec;
      const bool node_first = nodes && node_leader(nodes->copies.node_of_rank, engine.rank()) == engine.rank();
      if (node_first) {
        for (const char* tail : {"", ".old", ".partial"}) std::filesystem::remove_all(nodes->dir + tail, ec);
      }
      if (says && !nodes) {
        for (const char* tail : {"", ".old", ".partial"}) std::filesystem::remove_all(memory_dir + tail, ec);
      }
      if (nodes) {
        nodes->comm->barrier()->wait(engine.options().timeout);
        if (says) std::filesystem::remove(memory_dir, ec);  // (only once empty)
      }
    }
    if (export_path.empty()) return;
    engine.export_safetensors(export_path);
    if (says) std::printf("weights exported to %s\n", export_path.c_str());
  }

 private:
  // Waits for the save in flight. A save into --save DIR that fails (a full or read-only disk) ends
  // the run, unless memory checkpoints are taken: then it is reported and the run goes on with them.
  // Every rank reaches the same verdict (the save's wait is collective).
  void settle(Engine& engine) const {
    const bool files = std::exchange(file_saves->in_flight, false);
    try {
      engine.wait_for_save();
      if (files) file_saves->last_failed = false;
    } catch (const IoError& e) {
      if (!files) throw;
      outlive(engine, e);
    }
  }
  void outlive(Engine& engine, const IoError& e) const {
    if (memory_dir.empty()) throw e;
    file_saves->last_failed = true;
    if (engine.rank() == 0) {
      std::printf("checkpoint into %s failed; going on with the checkpoints in memory (%s): %s\n", save_dir.c_str(),
                  memory_dir.c_str(), e.what());
    }
  }
};

}  // namespace zero::examples
