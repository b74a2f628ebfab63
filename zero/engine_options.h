#pragma once
// Options of the sharded engine. Plain structs with defaults; Engine validates them once at
// construction and names the offending field in the error.
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "layout/layout.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "zero/shard_layout.h"

namespace zero {

enum class LossScaling { kNone, kStatic, kDynamic };
// "none", "static", "dynamic" (the fingerprint's and the config files' spelling).
const char* loss_scaling_name(LossScaling s);

// ZeRO-Offload: the fp32 master weights and the optimizer state live in host memory and the CPU
// optimizer updates them there; the device keeps the model-dtype parameters and gradients. Each
// bucket's reduced gradient shard goes device-to-host into staging, is applied on the host, and its
// new parameter values go host-to-device, pipelined bucket by bucket (zero/offload_pipeline.h). The
// CPU optimizer runs optimizer.num_threads threads.
struct OffloadOptions {
  bool optimizer = false;
  // Stage 3, with the optimizer offloaded: the parameter shard lives in host memory too and each
  // unit's chunk is copied to the device ahead of its all-gather (as part of prefetch).
  bool params = false;
  // Copy staging in page-locked host memory (what asynchronous device copies need to overlap), or
  // pageable memory.
  bool pinned_staging = true;
};

// When a unit's gradients are reduced over a step's micro-batches.
enum class MicroBatchReduce {
  // kEach for micro-batches run one after another (FSDP's and DeepSpeed's accumulation), kOnce for
  // a pipeline's interleaved ones (Megatron-LM's and torchtitan's).
  kDefault,
  // After every micro-batch's backward, into the shard's accumulator: stages 2 and 3 hold a unit's
  // whole gradient only while it is in flight; micro_batches times the reduction traffic. Under a
  // pipeline stages 2 and 3 only (stages 0 and 1 keep the whole gradient anyway), and units holding
  // a tied parameter still reduce once per step.
  kEach,
  // After the unit's last micro-batch: gradients accumulate whole in the gradient buffers (what
  // Engine::no_sync() does for the micro-batches it covers) and are reduced once per step.
  kOnce,
};
// Stage 3: whether a unit is gathered again for each micro-batch.
enum class MicroBatchGather {
  // kEach for micro-batches run one after another, kOnce for a pipeline's.
  kDefault,
  // Units leave the gather window as at one micro-batch and are gathered again for each
  // micro-batch's forward and backward (the window's memory, micro_batches times the gathers).
  kEach,
  // A unit gathered for its first micro-batch stays gathered to the step's end (one gather per unit
  // and step, the stage's parameters whole through it: torchtitan's choice under pipelining),
  // unless max_live_gathered_bytes is set lower. Interleaved micro-batches only.
  kOnce,
};
// "default", "each", "once" (the config files' spelling); parse_* throw InvalidArgument naming the text.
const char* micro_batch_policy_name(MicroBatchReduce r);
const char* micro_batch_policy_name(MicroBatchGather g);
MicroBatchReduce parse_micro_batch_reduce(const std::string& name);
MicroBatchGather parse_micro_batch_gather(const std::string& name);

struct EngineOptions {
  // 0: replicated optimizer, all-reduced gradients (DDP). 1: optimizer state sharded. 2: gradients
  // sharded too (reduce-scattered bucket by bucket during backward). 3: parameters sharded too:
  // each unit is all-gathered just in time inside its gather scopes (with prefetch) and its
  // gradients reduce-scattered when its backward scope ends.
  int stage = 2;

  optim::OptimizerOptions optimizer;

  // Global L2 gradient-norm clipping (torch.nn.utils.clip_grad_norm_ semantics); 0 disables it.
  float max_grad_norm = 0.0f;

  // Stage 3's mixed precision (FSDP2's MixedPrecisionPolicy.param_dtype): the dtype the parameter
  // shard is kept in and the units are all-gathered and computed in, and the gradients written in,
  // when it differs from the registered dtype. fp32 storage with a bf16 param_dtype halves the
  // gathers; the master is initialized from the registered fp32 values, and checkpoints and exports
  // keep the registered dtype. Unset: the registered dtype. Below stage 3 the parameters are the
  // registered storage itself, so there it must be unset (register them in the dtype to compute in).
  // (Parameters may be registered in different dtypes, e.g. fp32 LayerNorms and biases beside bf16
  // matrices; param_dtype, when set, applies to all of them.)
  std::optional<DType> param_dtype;

  // Element type the gradient collectives run in: fp32, or the dtype gradients are written in. With
  // parameters of two dtypes, a 16-bit one (the other being fp32) reduces each bucket in its own.
  DType reduce_dtype = DType::kFloat32;
  // Stage 2 gradient shard, and the accumulator used when gradients are reduced every micro-step of
  // an accumulation: fp32, or the dtype gradients are written in (each bucket's own, as above).
  DType grad_accum_dtype = DType::kFloat32;

  // A step is `micro_batches` micro-batches on each data-parallel rank (gradient accumulation and a
  // pipeline's micro-batches are the same axis): every unit's backward runs that many times per
  // step (a split backward's weight part is what counts), and the loss is their mean (gradients
  // divided by micro_batches x the data-parallel size). They run one after another, each closed by
  // finish_backward(), or interleaved within one micro-step by a pipeline schedule, which says so
  // (Engine::interleave_micro_batches; parallel::PipelineStage does). How units reduce and gather
  // across them is the two policies below.
  int micro_batches = 1;
  MicroBatchReduce micro_batch_reduce = MicroBatchReduce::kDefault;
  MicroBatchGather micro_batch_gather = MicroBatchGather::kDefault;

  // Rank contributions are summed in rank order in fp32 (all-to-all, then an ordered local sum), so
  // stages 0, 1 and 2 give bitwise-identical parameters, and N ranks give bitwise the result of one
  // rank accumulating the same N micro-batches in rank order. (For 16-bit models, stages 0 and 1
  // keep the reduced gradients in the model dtype: stage 2 matches them bit for bit when
  // grad_accum_dtype is the model dtype too.)
  bool deterministic = false;

  LossScaling loss_scaling = LossScaling::kNone;
  float static_loss_scale = 1.0f;
  optim::LossScalerOptions dynamic_loss_scaler;

  ShardLayoutOptions layout{.alignment = 16, .bucket_numel = 1 << 23, .block = 1024};

  // Gradient buckets whose reduction may be in flight at once (each holds one bucket buffer).
  int max_inflight_buckets = 2;

  // Stage 3. A unit the recorded order asks for again later in the step stays in the window after
  // its forward scope until room is needed; other units leave at once. false: every forward is
  // kept for its backward, also where no order is recorded (the first step, after an order change),
  // FSDP's ZeRO-2-like trade. Either way a kept unit leaves when a unit in use needs the room.
  bool reshard_after_forward = true;
  // Gathered bytes issued ahead of use, following the unit order recorded in the first step
  // (0: one unit ahead, as FSDP2).
  size_t prefetch_bytes = 0;
  // The gather window's limit (0: two of the largest unit): the units in use, prefetched, kept, and
  // kept for reuse later in the step never exceed it. The knob that trades memory for gathers.
  size_t max_live_gathered_bytes = 0;
  // Units of at most this many bytes stay gathered from their first use to the end of the step.
  size_t param_persistence_bytes = 0;
  // Quantized gathers (ZeRO++'s qwZ): each rank's chunk of a unit goes over the wire as `bits`-bit
  // codes with one fp32 scale per `block` elements (memory/block_quantization.h) and is
  // dequantized into the unit's dtype; the shard, the master and the update stay at full precision.
  // Every rank computes with the same dequantized values (its own chunk included). A unit kept from
  // its forward for its backward keeps its forward's values whatever `backward` says.
  struct QuantizedGathers {
    int bits = 0;          // 0: off; 8 or 4
    size_t block = 256;    // elements per scale
    bool backward = true;  // the backward's gathers too (false: the forward's only)
    // Evaluations' gathers too (EvaluationScope: validation, sampling). false (default): they gather
    // at full precision, so that a validation loss measures the parameters the run trains and saves.
    bool evaluation = false;
  };
  QuantizedGathers quantized_weights;
  // ZeRO++'s two parts that work on nodes, stage 3. The shard group is cut into nodes of `node_size`
  // consecutive ranks (launchers number a node's ranks consecutively; in a mesh the data-parallel
  // peers on one node are its devices / tp): comm::HybridGroups over the shard group, its shard
  // groups the nodes. 0: not given (hpZ and qgZ then refuse to run); it must divide the group.
  int node_size = 0;
  // hpZ: after a unit's forward gather each rank keeps its node's part of the gathered unit (1 /
  // node_size of it, the values the forward computed with), and the unit's backward gather runs
  // inside the node from those parts, so that only the forward's gather crosses nodes. The parts
  // stay from the forward to the step's end: padded parameter bytes / node_size more per rank,
  // counted with the gather window.
  bool secondary_shard = false;
  // qgZ: each unit's gradients reduced as `bits`-bit blocks in two all-to-alls, inside the node
  // (every rank sends each node-local peer what that peer's column of nodes needs), a dequantized
  // fp32 sum in rank order, then across nodes, and a final fp32 sum in node order, ending in the
  // shard a reduce-scatter would give. Deterministic by construction; 0: off.
  struct QuantizedReduction {
    int bits = 0;          // 0: off; 8 or 4
    size_t block = 256;    // elements per scale
    // Both hops' codes rounded stochastically (memory/block_quantization.h), so that each code's
    // mean is the value instead of round-to-nearest zeroing the small ones; each draw is keyed by
    // the step, the micro-step, the bucket, the piece, the row, the hop and the rank, so a run
    // (and a resume) repeats bit for bit. The host's and the CUDA kernels' codes are the same bytes.
    bool stochastic = false;
  };
  QuantizedReduction quantized_gradients;

  OffloadOptions offload;

  // Every this many steps (0: never) the data-parallel replicas compare CRC32Cs of what they must hold
  // alike, at the end of step(): the parameters at stages 0-2, the shard under hybrid sharding at
  // stage 3 (zero/replica_check.h). A mismatch throws on every rank naming the tensor, the rank
  // outside the majority and the step: silent data corruption caught before a checkpoint spreads it.
  // It costs one checksum pass over those bytes and one small all-gather per check.
  int replica_check_every = 0;

  // Deadline for every collective the engine waits on.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// The bits of quantized gathers a flag or key names: "int8" 8, "int4" 4, "off" 0; anything else is
// InvalidArgument naming `what` (e.g. "--quantized-weights").
int parse_quantized_bits(const std::string& name, const char* what);

// Throws InvalidArgument naming the field.
void validate(const EngineOptions& options);

// The options a run of `layout` (layout/layout.h) takes: base's, with the layout's stage, offload and
// micro-batches.
EngineOptions engine_options(const Layout& layout, EngineOptions base);
// InvalidArgument naming both values where `options` and the layout the mesh was built from disagree
// on the stage or the offload (options built by hand beside a layout that says otherwise).
void check_layout(const EngineOptions& options, const Layout& layout);

// Every option that must be the same on all ranks, as (field, value) pairs in a fixed order, e.g.
// ("EngineOptions.optimizer.groups[0].lr", "0.001"). Floats print in their shortest exact form, so
// two values compare equal as text exactly when they are equal. Local resources (thread counts,
// in-flight bucket limits, the timeout) are left out: ranks may differ there.
std::vector<std::pair<std::string, std::string>> fingerprint(const EngineOptions& options);

}  // namespace zero
