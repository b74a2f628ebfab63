#pragma once
// Optimizers over one flat fp32 shard of master weights (ZeRO/FSDP style): AdamW, Adam, SGD, Adagrad
// and Lion with PyTorch 1.13's semantics (the single-tensor, foreach=False code, operation for
// operation), fused with the gradient unscale/clip, the 16-bit gradient read, and the 16-bit model
// copy-out, in one streaming pass over memory.
//
// The shard is described by segments: contiguous element ranges, each belonging to a parameter (for
// checkpoints) and a parameter group (for hyperparameters). Elements outside every segment are padding
// and are never read or written by step().
//
// The CPU kernels (scalar, AVX2, AVX-512; the path chosen at run time) use the same operations in the
// same order without FMA contraction, so fp32 results are bitwise equal across paths and thread counts.
//
// Thread safety: one step() at a time per Optimizer; accessors may be used between steps.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "memory/tracker.h"
#include "optim/optimizer_kind.h"

namespace zero::optim {

class CustomOptimizer;  // optim/custom_optimizer.h

// "adamw", "adam", "sgd", "adagrad", "lion", "muon", "adamw8bit", "adafactor".
const char* optimizer_name(OptimizerKind kind);
// Inverse of optimizer_name; throws InvalidArgument naming the accepted values.
OptimizerKind parse_optimizer(std::string_view name);
// The state arrays `kind` keeps per element, in Optimizer::state_names() order (each shard_numel
// elements of OptimizerOptions::state_dtype).
std::vector<std::string> optimizer_state_names(OptimizerKind kind);

// Muon's own hyperparameters (Moonlight's defaults). Per matrix and step, with g the gradient:
//   m = momentum * m + g;  u = nesterov ? g + momentum * m : m
//   O = newton_schulz(u, ns_steps)                      (optim/newton_schulz.h)
//   W = W * (1 - lr * weight_decay) - lr * rms_scale * sqrt(max(rows, cols)) * O
// rms_scale 0.2 gives the update about AdamW's RMS, so AdamW's lr and weight decay carry over.
// A matrix split across tensor-parallel ranks is orthogonalized whole (gathered over tp, rows and
// cols the whole matrix's); per_part orthogonalizes each rank's part by itself, with its own shape
// (no gather; a different update, Megatron's "blockwise" mode). bf16 runs Newton-Schulz in bf16 as
// GPU recipes do (NewtonSchulzOptions::bf16; emulated on the host, for parity, not speed).
struct MuonHyper {
  float momentum = 0.95f;
  bool nesterov = false;
  int ns_steps = 5;
  float rms_scale = 0.2f;
  bool per_part = false;
  bool bf16 = false;
};

// Adafactor's own hyperparameters (Shazeer and Stern, ICML 2018; no first moment unless beta1 > 0).
// Per tensor X (a matrix: shape[0] x the rest; else a vector) and step t, with S = G^2 + eps1:
//   b = 1 - t^-decay_rate
//   matrix: R = b R + (1 - b) S 1 (row sums);  C = b C + (1 - b) 1^T S (column sums);  V = R C / (1^T R)
//   vector: V = b V + (1 - b) S
//   U = G / sqrt(V);  U = U / max(1, RMS(U) / clip_threshold)
//   alpha = relative_step ? max(eps2, RMS(X)) min(1e-2, 1/sqrt(t)) : lr
//   beta1 = 0:  X = X (1 - alpha weight_decay) - alpha U
//   beta1 > 0:  M = beta1 M + (1 - beta1) alpha U;  X = X (1 - alpha weight_decay) - M
// (the first moment of the scaled update, as Hugging Face's Adafactor keeps it: state
// "exp_avg_update", not AdamW's gradient average, so a conversion never reads one as the other; 4
// bytes per element of the groups that set it)
// (zero/adafactor_update.h: the sums over ranks, the arithmetic.)
struct AdafactorHyper {
  float eps1 = 1e-30f;
  float eps2 = 1e-3f;
  float clip_threshold = 1.0f;  // the paper's d
  float decay_rate = 0.8f;
  bool relative_step = false;
  float beta1 = 0.0f;  // [0, 1); 0: no first moment
};

// Hyperparameters of one parameter group (PyTorch's names and defaults; Lion's defaults are the
// user's to set, its paper suggests lr 3-10x smaller and weight decay 3-10x larger than AdamW's).
struct Hyper {
  float lr = 1e-3f;
  float weight_decay = 0.0f;  // AdamW, Lion: decoupled (p *= 1 - lr*wd); Adam, SGD, Adagrad: L2
  float beta1 = 0.9f;         // Adam, AdamW, Lion
  float beta2 = 0.999f;       // Adam, AdamW, Lion
  float eps = 1e-8f;          // Adam, AdamW, Adagrad (PyTorch's Adagrad default is 1e-10)
  float momentum = 0.0f;      // SGD
  float dampening = 0.0f;     // SGD
  bool nesterov = false;      // SGD
  float lr_decay = 0.0f;                   // Adagrad
  float initial_accumulator_value = 0.0f;  // Adagrad
  // The group's rule; unset: OptimizerOptions::kind. An engine runs groups of different kinds side
  // by side (Muon for the matrices, AdamW for the rest: Moonlight's recipe); optim::Optimizer runs
  // one elementwise kind.
  std::optional<OptimizerKind> kind;
  MuonHyper muon;            // Muon
  AdafactorHyper adafactor;  // Adafactor
  // The parameters this group takes, by name pattern ('*' matches any run of characters, '?' any one
  // character; "h.*.attn.*.weight"): an engine puts a parameter that one group's patterns match in
  // that group, whatever its ParamSpec::group, and refuses one that two groups' patterns match,
  // naming both (group_by_name). Empty: the group takes the parameters registered into it.
  std::vector<std::string> params;
};

// Whether `name` matches `pattern` ('*': any run of characters, '?': any one character).
bool name_matches(std::string_view pattern, std::string_view name);

// A contiguous element range of the flat shard.
// A parameter held in slices across ranks (tensor parallelism's split), as a rule that needs whole
// tensors (CustomOptimizer::needs_whole_tensors) sees it: given this rank's fp32 arrays of its slice
// (`local`, `numel` elements each: the master, the gradient, each state), it gathers each into the
// whole tensor, calls `update` on the whole arrays (`whole_numel` elements each), and keeps this
// rank's slice of each. Collective over the slices' ranks. Empty: the parameter is whole here.
using WholeTensorUpdate = std::function<void(std::span<float* const> whole, size_t whole_numel)>;
using WholeTensorGather =
    std::function<void(std::span<float* const> local, size_t numel, const WholeTensorUpdate& update)>;

struct Segment {
  size_t begin = 0, end = 0;  // [begin, end) in shard elements
  int group = 0;              // index into OptimizerOptions::groups
  std::string param_name;     // the parameter these elements belong to ("" marks padding: skipped)
  size_t param_offset = 0;    // element offset inside that parameter where this segment starts
  WholeTensorGather whole;    // set where the parameter is a slice of one held across ranks
  // The parameter as a matrix (Muon: rows = shape[0], cols = the rest); 0 where it has fewer than
  // two dimensions.
  size_t rows = 0, cols = 0;
  size_t param_numel = 0;  // the parameter's elements (8-bit AdamW keeps small ones in fp32); 0: unknown
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  // A rule of the user's (optim/custom_optimizer.h) in place of `kind`: the engine runs it on the
  // host (on a CUDA device, with offload.optimizer). optim::Optimizer itself refuses one.
  std::shared_ptr<CustomOptimizer> custom;
  std::vector<Hyper> groups = std::vector<Hyper>(1);  // one default group
  DType state_dtype = DType::kFloat32;  // kFloat32 or kBFloat16 (rounded to nearest even)
  int num_threads = 1;                  // threads of the step, the caller's included
  std::optional<SimdPath> simd_path = std::nullopt;  // default best_simd_path()
  // Where the state's bytes are accounted (an engine's own tracker); nullptr: the process-wide one.
  memory::MemoryTracker* tracker = nullptr;
  // 8-bit AdamW (adamw8bit, optim/adamw8bit.h): its state is quantized in blocks of quant_block
  // elements of each tensor (a power of two in [64, 4096]); tensors of fewer than quant_min_numel
  // elements keep fp32 AdamW state (bitsandbytes' defaults: 256 and 4096).
  size_t quant_block = 256;
  size_t quant_min_numel = 4096;
};

// The group whose `params` patterns match parameter `name`; nullopt when none does. InvalidArgument
// naming the parameter, both groups and their patterns when two do.
std::optional<int> group_by_name(const OptimizerOptions& options, std::string_view name);

struct StepInput {
  float* master = nullptr;  // shard_numel fp32 master weights, updated in place
  const void* grad = nullptr;  // shard_numel gradients of grad_dtype (fp32, fp16 or bf16)
  DType grad_dtype = DType::kFloat32;
  float grad_scale = 1.0f;  // the gradient is multiplied by this first (loss unscale * clip coefficient)
  void* model_out = nullptr;  // optional copy-out of the updated master (fp16/bf16 RNE, or fp32)
  DType model_dtype = DType::kBFloat16;
  // Optional lengths of the three arrays: when set they must equal shard_numel (a mismatch throws
  // InvalidArgument naming the field), so callers holding spans get a length check for free.
  std::optional<size_t> master_numel = std::nullopt, grad_numel = std::nullopt,
                        model_numel = std::nullopt;
};

class Optimizer {
 public:
  // Validates the options (lr < 0, betas outside [0,1), eps <= 0, weight_decay < 0, momentum < 0,
  // dampening outside [0,1], nesterov without momentum or with dampening, lr_decay < 0,
  // initial_accumulator_value < 0, non-finite values), the segments (begin > end, end > shard_numel,
  // overlapping, group index out of range, overlapping ranges of one parameter), state_dtype,
  // num_threads and simd_path; throws InvalidArgument naming the field and the group or segment index.
  // Allocates the state (zero; Adagrad's "sum" is initial_accumulator_value) and starts the threads.
  Optimizer(const OptimizerOptions& options, size_t shard_numel, std::vector<Segment> segments);
  ~Optimizer();
  Optimizer(Optimizer&&) noexcept;
  Optimizer& operator=(Optimizer&&) noexcept;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One step over the whole shard. Elements outside every segment (padding) are left untouched, in
  // master, state and model_out alike. Re-validates the groups' hyperparameters (they may have been
  // changed through group()), then increments step_count(). Allocates nothing.
  void step(const StepInput& in);

  // The same step split over ranges of the shard, so a caller can update bucket by bucket (and
  // overlap each range's parameter all-gather with the next range's update):
  //   begin_step();  step_range(in_0, b0, e0);  step_range(in_1, b1, e1); ...
  // begin_step() validates the hyperparameters and increments step_count(); each step_range()
  // updates the segment elements inside [begin, end) with that step's coefficients. The pointers of
  // `in` point at element `begin` (grad[0] is the gradient of element begin), and its length
  // fields, when set, must equal end - begin. Every element must be covered once per step for the
  // result to equal step(); the ranges are not tracked.
  void begin_step();
  void step_range(const StepInput& in, size_t begin, size_t end);

  int64_t step_count() const;
  // For checkpoint loading. Also tells SGD whether its momentum buffers exist (step_count > 0).
  void set_step_count(int64_t steps);

  OptimizerKind kind() const;
  size_t shard_numel() const;
  const std::vector<Segment>& segments() const;
  Hyper& group(int i);  // e.g. to set lr from a schedule; validated at the next step()
  const Hyper& group(int i) const;
  int num_groups() const;
  int num_threads() const;
  SimdPath simd_path() const;

  // AdamW/Adam: "exp_avg", "exp_avg_sq"; SGD: "momentum_buffer"; Adagrad: "sum"; Lion: "exp_avg".
  std::vector<std::string> state_names() const;
  DType state_dtype() const;
  // shard_numel elements of state_dtype; throws InvalidArgument for an unknown name.
  void* state_data(const std::string& name);
  const void* state_data(const std::string& name) const;

  // Checkpoint support: state addressed by parameter name and an element range inside that
  // parameter. Copies the overlap of [param_begin, param_end) with this shard's segments of that
  // parameter, to/from out/in indexed from param_begin (out[k] is element param_begin + k); elements
  // of the range not in this shard are not touched. Returns the number of elements copied. fp32 in
  // and out whatever state_dtype is (bf16 state is written rounded to nearest even).
  size_t read_state(const std::string& state, const std::string& param_name, size_t param_begin,
                    size_t param_end, float* out) const;
  size_t write_state(const std::string& state, const std::string& param_name, size_t param_begin,
                     size_t param_end, const float* in);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws InvalidArgument naming "groups[<index>].<field>" if a hyperparameter that `kind` uses is
// out of range. Exposed for callers that validate a configuration before building an optimizer.
void validate_hyper(OptimizerKind kind, const Hyper& h, int group_index);
// The same for the options' rule: the custom one's validate(), else validate_hyper(kind).
void validate_groups(const OptimizerOptions& options);
// quant_block (8-bit AdamW's).
void validate_quantization(const OptimizerOptions& options);

// Group `g`'s rule: its own kind, else the options' (InvalidArgument for an index out of range).
OptimizerKind group_kind(const OptimizerOptions& options, int g);
// The distinct rules of the groups, in the order groups first use them.
std::vector<OptimizerKind> group_kinds(const OptimizerOptions& options);

// Whether a group runs a rule that needs whole matrices (Muon; not a custom rule's
// needs_whole_tensors, which has a layout of its own).
bool has_matrix_groups(const OptimizerOptions& options);
// The rule that updates a tensor of `numel` elements in group g: the group's, except that an 8-bit
// AdamW group keeps tensors under quant_min_numel in fp32 AdamW.
OptimizerKind tensor_kind(const OptimizerOptions& options, int g, size_t numel);

// The options' rule by name: "custom:<name>" for a custom one, else the groups' kinds joined by "+"
// in group order ("adamw"; "muon+adamw") (the checkpoint manifest's and the ranks' agreement's key).
std::string optimizer_label(const OptimizerOptions& options);
// The options' state arrays: the custom rule's state_names(), else those of every group's kind, in
// group_kinds() order without repeats (an element keeps only its own kind's), and "exp_avg_update"
// where an Adafactor group keeps a first moment.
std::vector<std::string> optimizer_state_names(const OptimizerOptions& options);
// Whether an Adafactor group keeps a first moment (AdafactorHyper::beta1 > 0).
bool adafactor_first_moment(const OptimizerOptions& options);

}  // namespace zero::optim
