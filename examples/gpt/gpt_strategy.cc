#include "examples/gpt/gpt_strategy.h"

#include <fmt/format.h>

#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/gpt_plan.h"
#include "parallel/tensor/vocab_parallel.h"

namespace zero::examples {

using strategy::TpCollective;

const char* gpt_part_name(GptPart part) {
  static const char* names[] = {"block", "embedding", "head"};
  return names[static_cast<int>(part)];
}

std::string GptCosts::name() const {
  const GptConfig& c = config_;
  return fmt::format("GPT {} layers, n_embd {}, {} heads, vocabulary {}, context {}", c.n_layer, c.n_embd, c.n_head,
                     c.vocab_size, c.block_size);
}

int GptCosts::micro_batch_size(const Layout& l, int global_batch) { return global_batch / (l.dp * l.micro_batches); }

std::string GptCosts::unsupported(const Layout& l, int global_batch) const {
  const GptConfig& c = config_;
  if (c.n_head % l.tp != 0) return fmt::format("tp {} does not divide the {} heads", l.tp, c.n_head);
  if (l.sequence_parallel && c.block_size % l.tp != 0) {
    return fmt::format("sequence parallelism: tp {} does not divide the context {}", l.tp, c.block_size);
  }
  if (l.virtual_stages() > c.n_layer) {
    return l.chunks > 1 ? fmt::format("pp {} x {} chunks is more stages than the {} layers", l.pp, l.chunks, c.n_layer)
                        : fmt::format("pp {} is more stages than the {} layers", l.pp, c.n_layer);
  }
  if (l.chunks > 1 && l.micro_batches % l.pp != 0) {
    return fmt::format("interleaved: {} micro-batches are not a multiple of pp {}", l.micro_batches, l.pp);
  }
  if (global_batch % (l.dp * l.micro_batches) != 0) {
    return fmt::format("the batch {} does not divide into dp {} x {} micro-batches", global_batch, l.dp, l.micro_batches);
  }
  return "";
}

std::string GptCosts::kernel_key(GptPart part, GptPass pass, int batch, int tp, bool sp, bool collectives) const {
  const GptConfig& c = config_;
  static const char* passes[] = {"f", "b", "w"};
  return fmt::format("gpt/{},{},{},{},{}/{}/b{}/tp{}/sp{}/{}{}", c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.block_size,
                     gpt_part_name(part), batch, tp, sp ? 1 : 0, passes[static_cast<int>(pass)],
                     collectives ? "+tp" : "");
}

std::string GptCosts::crowded_key(GptPart part, GptPass pass, int batch, int tp, bool sp, int ranks) const {
  return fmt::format("{}@{}", kernel_key(part, pass, batch, tp, sp, true), ranks);
}

std::string GptCosts::alone_key(GptPart part, GptPass pass, int batch) const {
  return kernel_key(part, pass, batch, 1, false) + "+alone";
}

double GptCosts::flops(GptPart part, GptPass pass, int batch, int tp) const {
  const double C = config_.n_embd, T = config_.block_size, R = static_cast<double>(batch) * T;
  switch (part) {
    case GptPart::kBlock: {
      // qkv, the attention output, the MLP's two: 2 R (3 + 1 + 4 + 4) C^2 / tp; attention's scores
      // and weighted sum 4 b T^2 C / tp, twice that backward (dq, dk, dv, dprobs).
      const double linear = 24 * R * C * C / tp, attention = 4.0 * batch * T * T * C / tp;
      return pass == GptPass::kForward ? linear + attention : pass == GptPass::kInput ? linear + 2 * attention : linear;
    }
    case GptPart::kHead: {
      const double V = static_cast<double>(parallel::padded_vocab(config_.vocab_size, tp)) / tp;
      return 2 * R * C * V;  // logits, their input gradient, wte's gradient: one product each
    }
    case GptPart::kEmbedding:
      return 0;  // lookups
  }
  return 0;
}

namespace {

// Ranks per core when a layout has more ranks than a shared-core machine has cores; else 0.
double crowding(const Layout& l, const strategy::Cluster& cluster) {
  const double per_core = static_cast<double>(l.world()) / cluster.devices();
  return cluster.shared_cores && per_core > 1 ? per_core : 0.0;
}

}  // namespace

GptCosts::Timed GptCosts::timed_as(GptPart part, int batch, const Layout& l, const strategy::Cluster& cluster) const {
  if (l.tp == 1) return Timed::kCompute;
  auto all_passes = [&](auto key) {
    for (GptPass pass : {GptPass::kForward, GptPass::kInput, GptPass::kWeight}) {
      if (!cluster.kernels.count(key(pass))) return false;
    }
    return true;
  };
  const bool sp = l.sequence_parallel;
  if (crowding(l, cluster) > 0 &&
      all_passes([&](GptPass pass) { return crowded_key(part, pass, batch, l.tp, sp, l.world()); })) {
    return Timed::kCrowded;
  }
  if (all_passes([&](GptPass pass) { return kernel_key(part, pass, batch, l.tp, sp, true); })) {
    return Timed::kWithCollectives;
  }
  return Timed::kCompute;
}

double GptCosts::seconds(GptPart part, GptPass pass, int batch, const Layout& l, const strategy::Cluster& cluster) const {
  if (cluster.shared_cores && l.world() == 1) {
    const auto alone = cluster.kernels.find(alone_key(part, pass, batch));
    if (alone != cluster.kernels.end()) return alone->second;
  }
  const Timed how = timed_as(part, batch, l, cluster);
  if (how == Timed::kCrowded) {
    return cluster.kernels.at(crowded_key(part, pass, batch, l.tp, l.sequence_parallel, l.world())) /
           crowding(l, cluster);
  }
  const auto it = cluster.kernels.find(kernel_key(part, pass, batch, l.tp, l.sequence_parallel,
                                                  how == Timed::kWithCollectives));
  if (it != cluster.kernels.end()) return it->second;
  return flops(part, pass, batch, l.tp) / (cluster.peak_flops * cluster.matmul_efficiency);
}

strategy::StageCosts GptCosts::stage(const Layout& l, int s, int global_batch, const strategy::Cluster& cluster) const {
  const GptConfig& c = config_;
  const int b = micro_batch_size(l, global_batch), T = c.block_size;
  const int stages = l.virtual_stages();
  const GptStage st = stages > 1 ? gpt_stages(c.n_layer, stages)[static_cast<size_t>(s)] : GptStage{0, c.n_layer, true, true};
  strategy::StageCosts out;
  const auto key = std::make_tuple(l.tp, l.sequence_parallel, stages, s);
  auto spec = specs_.find(key);
  if (spec == specs_.end()) {
    spec = specs_
               .emplace(key, std::make_shared<const plan::ModelSpec>(
                                 gpt_model_spec(c, dtype_, l.tp, l.sequence_parallel, stages > 1 ? &st : nullptr)))
               .first;
  }
  out.engine = spec->second;
  out.units = c.n_layer + 2;
  const int blocks = st.end_layer - st.first_layer;
  auto pass_time = [&](GptPass pass) {
    double t = blocks * seconds(GptPart::kBlock, pass, b, l, cluster);
    if (st.first) t += seconds(GptPart::kEmbedding, pass, b, l, cluster);
    if (st.last) t += seconds(GptPart::kHead, pass, b, l, cluster);
    return t;
  };
  out.forward = pass_time(GptPass::kForward);
  out.backward_input = pass_time(GptPass::kInput);
  out.backward_weight = pass_time(GptPass::kWeight);
  // Recompute: the blocks' forward again, at the start of the backward's input part.
  if (l.recompute) out.backward_input += blocks * seconds(GptPart::kBlock, GptPass::kForward, b, l, cluster);
  if (l.tp > 1) {
    // The residual stream of a micro-batch, fp32 (the model computes in fp32 whatever it stores).
    const double stream = 4.0 * b * T * c.n_embd;
    const bool sp = l.sequence_parallel;
    auto& f = out.tp_forward;
    auto& bw = out.tp_backward;
    const bool measured_block = measured_with_collectives(GptPart::kBlock, b, l, cluster);
    for (int k = 0; k < blocks && !measured_block; ++k) {
      // Attention and the MLP: each entered (f) and left (g).
      for (int region = 0; region < 2; ++region) {
        const size_t before = f.size();
        strategy::add_region_collectives(1, 1, sp, stream, f, bw);
        // Recompute runs the forward's again in the backward.
        if (l.recompute) bw.insert(bw.end(), f.begin() + static_cast<std::ptrdiff_t>(before), f.end());
      }
    }
    if (st.first && !measured_with_collectives(GptPart::kEmbedding, b, l, cluster)) {
      // The vocabulary-parallel embedding leaves a region.
      strategy::add_region_collectives(0, 1, sp, stream, f, bw);
    }
    if (st.last && !measured_with_collectives(GptPart::kHead, b, l, cluster)) {
      // The head enters one; the loss sums its maximum, exponentials and target logits.
      strategy::add_region_collectives(1, 0, sp, stream, f, bw);
      for (int k = 0; k < 3; ++k) f.push_back({TpCollective::kAllReduce, 4.0 * b * T});
    }
  }
  const int rows = l.sequence_parallel ? b * T / l.tp : b * T;
  out.send_bytes = st.last ? 0.0 : 4.0 * rows * c.n_embd;
  const Gpt::MicroBatchBytes bytes = Gpt::micro_batch_bytes(c, st, l.tp, l.sequence_parallel, b, T, l.recompute);
  out.activation_bytes = bytes.forward;
  out.weight_work_bytes = bytes.weight_work;
  out.rebuilt_bytes = bytes.rebuilt;
  return out;
}

}  // namespace zero::examples
