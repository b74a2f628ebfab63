#include "zero/stage_policy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <map>
#include <set>

#include "base/check.h"
#include "base/logging.h"

namespace zero {

namespace {

// Stage 3: the registered storage stops being the parameter (the shard is), so it is filled with
// NaN: a loop that reads it outside a scope (an evaluation written the obvious way) sees NaN at
// once instead of training or evaluating against the initial values.
void poison_registered_storage(memory::Device& device, const std::vector<RegisteredValues>& storage,
                               const std::vector<size_t>& numels, std::chrono::milliseconds timeout) {
  constexpr size_t kPattern = 1 << 14;  // elements copied at a time
  memory::Stream& compute = device.compute_stream();
  std::map<DType, memory::Buffer> patterns;  // one per dtype the parameters have
  for (size_t t = 0; t < storage.size(); ++t) {
    const DType dtype = storage[t].dtype;
    const size_t es = dtype_size(dtype);
    memory::Buffer& pattern = patterns[dtype];
    if (pattern.empty()) {
      const uint32_t nan_bits = dtype == DType::kFloat32 ? 0x7FC00000u : dtype == DType::kBFloat16 ? 0x7FC0u : 0x7E00u;
      pattern = device.allocate_host_staging(kPattern * es, memory::Category::kOther);
      for (size_t i = 0; i < kPattern; ++i) std::memcpy(pattern.as<char>() + i * es, &nan_bits, es);
    }
    // The pattern once, then what is poisoned so far copied after itself: a copy per doubling, not
    // one per pattern (a billion-element tensor took 60,000 copies).
    char* dst = static_cast<char*>(const_cast<void*>(storage[t].data));
    size_t done = std::min(kPattern, numels[t]);
    if (done > 0) device.copy(dst, pattern.data(), done * es, compute);
    for (; done < numels[t]; done += std::min(done, numels[t] - done)) {
      device.copy(dst + done * es, dst, std::min(done, numels[t] - done) * es, compute);
    }
  }
  device.synchronize(compute, timeout);  // the patterns are read until here
}

}  // namespace

std::optional<ModelDtypes> check_registration(const EngineOptions& options, ParamRegistry& registry) {
  const int groups = static_cast<int>(options.optimizer.groups.size());
  ModelDtypes dtypes{options.param_dtype, std::nullopt};
  std::set<DType> registered, computed;  // over the trainable parameters
  for (const ParamSpec& p : registry.params()) {
    if (p.group >= groups) {
      registry.note_error(
          fmt::format("parameter '{}': group {} but the optimizer has {} group(s)", p.name, p.group, groups));
    }
    if (!p.requires_grad) continue;
    registered.insert(p.dtype);
    computed.insert(dtypes.compute(p));
    if (dtypes.compute(p) == p.dtype) continue;
    if (options.stage < 3) {
      registry.note_error(fmt::format("parameter '{}': ParamSpec.param_dtype {} needs stage 3 (got stage {}): below it "
                                      "the parameters are your registered storage; register it in {} instead",
                                      p.name, dtype_name(dtypes.compute(p)), options.stage,
                                      dtype_name(dtypes.compute(p))));
      continue;
    }
    // Narrowing only: the shard in param_dtype is the master rounded, as for 16-bit registered
    // parameters; a wider param_dtype would hold nothing the registered values do not.
    if (p.dtype != DType::kFloat32 || dtypes.compute(p) == DType::kFloat32) {
      registry.note_error(fmt::format("EngineOptions.param_dtype {} with parameter '{}' in {}: param_dtype must be the "
                                      "registered dtype, or fp16 or bf16 with fp32 parameters (ParamSpec.param_dtype "
                                      "sets one parameter's)",
                                      dtype_name(dtypes.compute(p)), p.name, dtype_name(p.dtype)));
    }
    // A gradient the user owns is in the registered dtype; the engine's are in param_dtype.
    if (p.grad.ptr != nullptr) {
      registry.note_error(fmt::format("parameter '{}' brings its own gradient storage (ParamSpec.grad) in {}, but "
                                      "{}.param_dtype {} writes gradients in {}: leave ParamSpec.grad empty",
                                      p.name, dtype_name(p.dtype), p.param_dtype ? "ParamSpec" : "EngineOptions",
                                      dtype_name(dtypes.compute(p)), dtype_name(dtypes.compute(p))));
    }
  }
  if (registered.empty()) {
    registry.note_error("no trainable parameters registered");
    return std::nullopt;
  }
  if (registered.size() == 1) dtypes.storage = *registered.begin();
  // Gradients are reduced and accumulated in fp32, or each in the dtype it is written in (a 16-bit
  // reduce or accumulate dtype: fp32 gradients beside it stay fp32).
  auto fits = [&](DType t, const char* field) {
    if (t == DType::kFloat32) return;
    std::string written;
    bool ok = true;
    for (DType d : computed) {
      written += fmt::format("{}{}", written.empty() ? "" : " and ", dtype_name(d));
      ok = ok && (d == t || d == DType::kFloat32);
    }
    if (ok && computed.count(t)) return;
    registry.note_error(fmt::format("EngineOptions.{} {} must be fp32 or the dtype gradients are written in ({}{})",
                                    field, dtype_name(t), written,
                                    computed.size() > 1 ? ", beside fp32: a 16-bit one keeps each bucket's own" : ""));
  };
  fits(options.reduce_dtype, "reduce_dtype");
  fits(options.grad_accum_dtype, "grad_accum_dtype");
  return dtypes;
}

namespace {

// How `p` lies in the whole tensor where a finalizer splits it (empty otherwise).
SplitTensor split_of(const GradFinalizers& finalizers, const ParamSpec& p) {
  for (const auto& f : finalizers) {
    if (SplitTensor s = f->split(p)) return s;
  }
  return {};
}

}  // namespace

MicroBatching micro_batching(const EngineOptions& o, bool interleaved) {
  MicroBatching mb;
  mb.interleaved = interleaved;
  const int m = o.micro_batches;
  if (!interleaved) {
    if (o.micro_batch_gather == MicroBatchGather::kOnce) {
      ZERO_THROW(InvalidArgument,
                 "EngineOptions.micro_batch_gather = once keeps units gathered across the micro-batches a pipeline "
                 "interleaves; run one after another, each micro-batch gathers its units again (each, the default)");
    }
    mb.micro_steps = m;
    mb.reduce_every_micro_step = o.micro_batch_reduce != MicroBatchReduce::kOnce;
    return mb;
  }
  mb.passes = m;
  mb.reduce_every_micro_step = true;
  mb.reduce_each_pass = o.micro_batch_reduce == MicroBatchReduce::kEach;
  if (mb.reduce_each_pass && o.stage < 2) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.micro_batch_reduce = each under a pipeline needs stage 2 or 3 (got stage {}): stages 0 "
               "and 1 keep the whole gradient anyway, so holding it across micro-batches costs nothing",
               o.stage);
  }
  mb.keep_gathered = o.stage == 3 && m > 1 && o.micro_batch_gather != MicroBatchGather::kEach;
  return mb;
}

void check_topology(const EngineOptions& options, bool has_replica) {
  if (has_replica && options.stage < 1) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.stage {} with a replica communicator: hybrid sharding shards state within a group, "
               "so it needs a sharded stage (1, 2 or 3; stage 0 replicates everything: pass one communicator over all ranks)",
               options.stage);
  }
}

std::vector<int> layout_tensor_order(const ParamRegistry& registry, const ModelDtypes& dtypes) {
  std::vector<int> order;
  for (int unit : registry.units()) {
    std::vector<int> ids;
    for (int id : registry.params_of_unit(unit)) {
      if (registry.param(id).requires_grad) ids.push_back(id);
    }
    std::vector<DType> kinds;
    for (int id : ids) {
      const DType d = dtypes.compute(registry.param(id));
      if (std::find(kinds.begin(), kinds.end(), d) == kinds.end()) kinds.push_back(d);
    }
    for (DType d : kinds) {
      for (int id : ids) {
        if (dtypes.compute(registry.param(id)) == d) order.push_back(id);
      }
    }
  }
  return order;
}

EngineParts wire_stage(const PolicyInputs& in) {
  const EngineOptions& o = *in.options;
  const ParamRegistry& reg = *in.registry;
  memory::Device& device = *in.device;
  EngineParts parts;

  std::vector<size_t> numels;
  std::vector<int> units;
  std::vector<DType> dtypes;  // each tensor's compute dtype
  // The global norm counts every element once over the norm group: a copy that a finalizer's group
  // holds whole (zero/grad_finalizer.h) is counted by that group's rank 0. Tensors of different
  // classes (which finalizers copy them) never share a block, so that the norm can skip whole blocks.
  const GradFinalizers& finalizers = in.finalizers;
  auto norm_class = [&](int id) {
    unsigned c = 0;
    for (size_t i = 0; i < finalizers.size(); ++i) c |= (finalizers[i]->copies(reg.param(id)) ? 1u : 0u) << i;
    return c;
  };
  auto counted_here = [&](int id) {
    for (const auto& f : finalizers) {
      if (f->copies(reg.param(id)) && f->group()->rank() != 0) return false;
    }
    return true;
  };
  bool classes = false, quantized = false;
  std::vector<bool> starts_block;
  unsigned previous_class = 0;
  for (int id : in.tensor_param) {
    numels.push_back(reg.numel(id));
    units.push_back(reg.param(id).unit);
    dtypes.push_back(in.dtypes.compute(reg.param(id)));
    const unsigned c = norm_class(id);
    // 8-bit state's blocks count from a tensor's first element: such a tensor starts a layout block,
    // so no quantization block spans two rank chunks or buckets (zero/adamw8bit_shard_optimizer.cc).
    const bool quantized_here =
        !o.optimizer.custom && optim::tensor_kind(o.optimizer, reg.param(id).group, reg.numel(id)) == optim::OptimizerKind::kAdamW8bit;
    starts_block.push_back((numels.size() > 1 && c != previous_class) || quantized_here);
    previous_class = c;
    classes = classes || c != 0;
    quantized = quantized || quantized_here;
  }
  if (!classes && !quantized) starts_block.clear();
  ShardLayoutOptions lo = o.layout;
  if (quantized) optim::validate_quantization(o.optimizer);
  if (quantized && lo.block % o.optimizer.quant_block != 0) {
    ZERO_THROW(InvalidArgument, "layout.block ({}) must be a multiple of optimizer.quant_block ({}) for 8-bit AdamW",
               lo.block, o.optimizer.quant_block);
  }
  // ZeRO++'s quantized gathers and reductions scale each block by its largest value: no block may
  // mix two tensors (a LayerNorm's gains near 1 would set the scale of a matrix's weights near 0.02
  // and round most of them away), so every tensor starts on a quantization block. Chunks start on
  // layout blocks, a multiple of it.
  size_t zeropp_block = 1;
  if (o.quantized_weights.bits != 0) zeropp_block = std::lcm(zeropp_block, o.quantized_weights.block);
  if (o.quantized_gradients.bits != 0) zeropp_block = std::lcm(zeropp_block, o.quantized_gradients.block);
  if (zeropp_block > 1) {
    lo.alignment = std::lcm(lo.alignment, zeropp_block);
    if (lo.block % lo.alignment != 0) {
      ZERO_THROW(InvalidArgument,
                 "layout.block ({}) must be a multiple of the quantized collectives' blocks (quantized_weights.block, "
                 "quantized_gradients.block: {}) and layout.alignment",
                 lo.block, zeropp_block);
    }
  }
  // Micro-batches reduced one by one: a unit's bucket is reduced each time its backward ends.
  const bool rounds = in.micro.each_pass_reduces();
  lo.unit_buckets = o.stage == 3 || rounds;
  // Muon gathers each matrix within one bucket's exchange (zero/matrix_exchange.h).
  lo.whole_tensor_buckets = lo.whole_tensor_buckets || optim::has_matrix_groups(o.optimizer);
  // Muon's matrices are never cut by a bucket (the exchange gathers them per bucket); the rest are.
  std::vector<bool> whole_in_bucket;
  if (lo.whole_tensor_buckets && optim::has_matrix_groups(o.optimizer)) {
    for (int id : in.tensor_param) {
      whole_in_bucket.push_back(optim::needs_whole_matrices(optim::group_kind(o.optimizer, reg.param(id).group)));
    }
  }
  parts.layout =
      std::make_unique<ShardLayout>(numels, in.shard->size(), lo, units, starts_block, dtypes, whole_in_bucket);
  ZERO_LOG_DEBUG("{}", parts.layout->describe());
  const ShardLayout& layout = *parts.layout;

  const bool sharded = o.stage >= 1;
  parts.ownership = std::make_unique<ShardOwnership>(sharded ? ShardOwnership::sharded(layout, in.shard->rank())
                                                             : ShardOwnership::replicated(layout));

  ReducerConfig rc;
  // 16-bit: each bucket's own dtype (check_registration allows no other beside fp32).
  auto own_unless_fp32 = [](DType t) { return t == DType::kFloat32 ? std::optional<DType>(t) : std::nullopt; };
  rc.reduce_dtype = own_unless_fp32(o.reduce_dtype);
  rc.full_grads = o.stage < 2;
  rc.accumulate = o.stage >= 2 || (in.micro.reduce_every_micro_step && in.micro.micro_steps > 1);
  rc.accum_dtype = o.stage >= 2 ? own_unless_fp32(o.grad_accum_dtype) : DType::kFloat32;
  rc.deterministic = o.deterministic;
  rc.max_inflight = o.max_inflight_buckets;
  // Stage 3's buckets are whole units, as large as an embedding, and whole-tensor buckets hold at
  // least world x their largest tensor: bound their reduce buffers.
  rc.piece_numel = o.stage == 3 || o.layout.whole_tensors ? o.layout.bucket_numel : 0;
  rc.timeout = o.timeout;
  rc.timings = in.timings;
  rc.rounds = rounds;
  parts.formula.stage = o.stage;
  parts.formula.world_size = in.shard->size();
  // Bytes per element, averaged over the parameters' dtypes.
  double compute_bytes = 0, data_numel = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    compute_bytes += static_cast<double>(numels[t] * dtype_size(dtypes[t]));
    data_numel += static_cast<double>(numels[t]);
  }
  parts.formula.param_bytes = parts.formula.grad_bytes = compute_bytes / data_numel;
  parts.formula.shard_grad_bytes = o.stage >= 2 && !rc.accum_dtype ? parts.formula.grad_bytes : 4;
  parts.formula.accumulator = o.stage < 2 && rc.accumulate;
  std::vector<UserGrad> user_grads;
  WritebackTarget target{&layout, {}};
  std::vector<UpdateTensor> tensors;
  std::vector<RegisteredValues> initial;
  for (int id : in.tensor_param) {
    const ParamSpec& p = reg.param(id);
    user_grads.push_back({p.grad.ptr});
    target.tensor_data.push_back(p.data.ptr);
    tensors.push_back({p.name, p.group, p.data.ptr, p.dtype, split_of(in.finalizers, p), p.shape});
    initial.push_back({p.data.ptr, p.dtype});
  }
  if (o.offload.optimizer) parts.offload_tracker = std::make_unique<memory::MemoryTracker>();
  if (o.secondary_shard || o.quantized_gradients.bits != 0) {
    if (o.node_size == 0) {
      ZERO_THROW(InvalidArgument,
                 "EngineOptions.{} needs EngineOptions.node_size, the data-parallel ranks on one node (DeepSpeed's "
                 "zero_hpz_partition_size; a program takes it from its launcher: LOCAL_WORLD_SIZE / tp)",
                 o.secondary_shard ? "secondary_shard (hpZ)" : "quantized_gradients (qgZ)");
    }
    if (in.shard->size() % o.node_size != 0) {
      ZERO_THROW(InvalidArgument,
                 "EngineOptions.node_size = {} does not divide the shard group's {} ranks: hpZ and qgZ cut it into "
                 "nodes of that many consecutive ranks",
                 o.node_size, in.shard->size());
    }
    parts.nodes = std::make_unique<comm::HybridGroups>(*in.shard, o.node_size);
    ZERO_LOG_INFO("stage 3: {} nodes of {} data-parallel ranks for{}{}", parts.nodes->num_shard_groups(), o.node_size,
                  o.secondary_shard ? " hpZ (backward gathers inside the node)" : "",
                  o.quantized_gradients.bits != 0 ? fmt::format(" qgZ (int{} gradients in two hops)", o.quantized_gradients.bits) : "");
  }
  if (o.quantized_gradients.bits != 0) {
    rc.quantized = memory::BlockQuantization{.block = o.quantized_gradients.block, .bits = o.quantized_gradients.bits};
    rc.stochastic_rounding = o.quantized_gradients.stochastic;
  }
  ReducerComms reducer_comms{in.shard, in.replica};
  if (rc.quantized) {
    reducer_comms.node = parts.nodes->shard();
    reducer_comms.across_nodes = parts.nodes->replica();
  }
  parts.reducer = std::make_unique<GradReducer>(rc, layout, *parts.ownership, reducer_comms,
                                                device, std::move(user_grads));
  if (o.stage == 3) {
    GathererConfig gc;
    gc.reshard_after_forward = o.reshard_after_forward;
    gc.prefetch_bytes = o.prefetch_bytes;
    gc.max_live_bytes = o.max_live_gathered_bytes;
    gc.persistence_bytes = o.param_persistence_bytes;
    if (o.quantized_weights.bits != 0) {
      gc.quantized = memory::BlockQuantization{.block = o.quantized_weights.block, .bits = o.quantized_weights.bits};
      gc.quantize_backward = o.quantized_weights.backward;
      gc.quantize_evaluation = o.quantized_weights.evaluation;
    }
    if (in.micro.keep_gathered) {
      // Every unit stays from its first use to the step's end; the window holds them all unless the
      // user bounds it.
      gc.persistence_bytes = std::numeric_limits<size_t>::max();
      if (gc.max_live_bytes == 0) {
        gc.max_live_bytes = layout.padded_bytes();
      }
    }
    gc.timeout = o.timeout;
    gc.timings = in.timings;
    gc.offload_tracker = o.offload.params ? parts.offload_tracker.get() : nullptr;
    if (o.secondary_shard) gc.node = parts.nodes->shard();
    parts.gatherer = std::make_unique<ParamGatherer>(gc, layout, *parts.ownership, *in.shard, device, initial);
    parts.writeback = make_shard_writeback(parts.gatherer->shard(), layout);
    parts.formula.secondary_shard = parts.gatherer->node_parts_bytes();
  } else if (sharded) {
    parts.writeback = make_gather_writeback(device, std::move(target), *in.shard, o.timeout, in.timings);
  } else {
    parts.writeback = make_local_writeback(device, std::move(target));
  }

  const ApplierInputs ai{.optimizer = o.optimizer,
                         .layout = &layout,
                         .ownership = parts.ownership.get(),
                         .device = &device,
                         .tensors = std::move(tensors),
                         .timeout = o.timeout,
                         .shard = in.shard};
  std::unique_ptr<UpdateApplier> applier;
  if (o.offload.optimizer) {
    applier = std::make_unique<OffloadPipeline>(ai, OffloadConfig{.pinned_staging = o.offload.pinned_staging,
                                                                  .host_tracker = parts.offload_tracker.get(),
                                                                  .timings = in.timings,
                                                                  .timeout = o.timeout});
  } else {
    applier = make_device_applier(ai);
  }
  parts.formula.offload_optimizer = o.offload.optimizer;
  parts.formula.offload_params = o.offload.params;
  UpdateConfig uc;
  uc.max_grad_norm = o.max_grad_norm;
  uc.timeout = o.timeout;
  // Where an owned piece's gradient lies in its bucket's reduced range (the partial sums' and the
  // copies' checks read it there).
  const auto reduced_range = [&](const OwnedPiece& piece) {
    return PartialGradSum::Piece{.bucket = piece.bucket,
                                 .offset = piece.opt_offset - parts.ownership->range(piece.bucket).opt_begin,
                                 .len = piece.tensor_end - piece.tensor_begin,
                                 .dtype = parts.reducer->reduced_dtype(piece.bucket)};
  };
  // The finalizers' partial sums over their groups, one PartialGradSum each (none without pieces).
  std::vector<std::unique_ptr<PartialGradSum>> partial_sums;
  for (const auto& f : finalizers) {
    std::vector<PartialGradSum::Piece> partial;
    for (const OwnedPiece& piece : parts.ownership->pieces()) {
      if (f->sums_reduced(reg.param(in.tensor_param[piece.tensor]))) partial.push_back(reduced_range(piece));
    }
    if (!partial.empty()) partial_sums.push_back(std::make_unique<PartialGradSum>(device, *f->group(), partial, o.timeout));
  }
  // The copies' gradient checks, over each group of more than one rank that shares the registration.
  std::vector<std::unique_ptr<CopiedGradCheck>> copied_checks;
  for (const auto& f : finalizers) {
    if (!f->same_registration() || f->group()->size() == 1) continue;
    uc.check_copies = true;
    std::vector<CopiedGradCheck::Piece> copied;
    for (const OwnedPiece& piece : parts.ownership->pieces()) {
      const ParamSpec& p = reg.param(in.tensor_param[piece.tensor]);
      if (!f->copies(p)) continue;
      const PartialGradSum::Piece r = reduced_range(piece);
      copied.push_back({.bucket = r.bucket, .offset = r.offset, .len = r.len, .dtype = r.dtype, .name = p.name});
    }
    if (!copied.empty()) {
      copied_checks.push_back(std::make_unique<CopiedGradCheck>(device, *f->group(), f->name(), std::move(copied), o.timeout));
    }
  }
  uc.model_parallel = in.norm_group;
  // The blocks' units (the norm's per-unit sums) and, with classes, whether this rank counts them,
  // as runs over the tensors in flat order; the padding between them is unit 0 and counted. A
  // block two tensors share has one unit and one class (units and classes start on a block).
  const size_t block = layout.options().block;
  size_t next = 0;  // the first block no run covers yet
  for (size_t t = 0; t < in.tensor_param.size(); ++t) {
    const ShardLayout::Tensor& lt = layout.tensors()[t];
    const bool counted = !classes || counted_here(in.tensor_param[t]);
    const size_t first = lt.offset / block, end = (lt.offset + lt.numel + block - 1) / block;
    ZERO_CHECK(first + 1 >= next, "tensor {} of the shard layout is out of flat order", t);
    if (first < next) {
      ZERO_CHECK(uc.runs.back().unit == units[t] && uc.runs.back().counted == counted,
                 "tensor {} shares a block with a tensor of another unit or norm class", t);
    }
    if (first > next) uc.runs.push_back({first, 0, true});
    if (end > next) uc.runs.push_back({end, units[t], counted});
    next = std::max(next, end);
  }
  parts.update = std::make_unique<ShardedUpdate>(std::move(uc), layout, *parts.ownership, *in.shard, device, std::move(applier),
                                                 *parts.writeback, std::move(partial_sums), std::move(copied_checks));
  const ShardOptimizer& opt = parts.update->optimizer();
  parts.formula.state_bytes = opt.state_bytes_per_element();
  // Last: the shard and the master above were read from the registered storage.
  if (parts.gatherer) poison_registered_storage(device, initial, numels, o.timeout);
  return parts;
}

}  // namespace zero
