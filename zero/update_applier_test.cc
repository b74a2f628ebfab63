// The update path on its own: gradients reduced by a GradReducer on two thread ranks, then stepped
// by an UpdateApplier — on the device (make_device_applier) or offloaded to the host
// (OffloadPipeline, pinned and pageable staging, copy streams on threads of their own) — and
// written back to every rank's parameters. Whatever the applier, the parameters and the master
// weights equal, bit for bit, one optimizer stepping the whole flat model with the summed gradients.
// Also the ShardOptimizer's checkpoint access to its state: ranges and names checked, bf16 state
// rounded to nearest even.
#include "zero/update_applier.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "memory/device.h"
#include "memory/tracker.h"
#include "testing/element.h"
#include "testing/thread_ranks.h"
#include "zero/grad_reducer.h"
#include "zero/offload_pipeline.h"
#include "zero/param_writeback.h"
#include "zero/shard_optimizer.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

const std::vector<size_t> kNumels = {300, 50, 700};
const ShardLayoutOptions kLayout{.alignment = 4, .bucket_numel = 256, .block = 16};
constexpr int kRanks = 2;
constexpr int kSteps = 3;
constexpr float kGradScale = 0.375f;

float initial(size_t t, size_t e) { return 0.25f * static_cast<float>((t * 7 + e) % 16) - 2.0f; }
// Rank r's gradient: small integers, so sums are exact in every dtype.
float grad_of(int r, int step, size_t t, size_t e) {
  return static_cast<float>((r + 1) * static_cast<int>((t + e + static_cast<size_t>(step)) % 4)) - 3.0f;
}

optim::OptimizerOptions adamw() {
  optim::OptimizerOptions o;
  o.kind = optim::OptimizerKind::kAdamW;
  o.groups[0].lr = 0.01f;
  o.groups[0].weight_decay = 0.1f;
  o.groups[0].eps = 0.1f;  // large enough that the gradient scale shows (Adam's step is scale-free but for eps)
  return o;
}

// One optimizer over the whole flat model, stepping with the gradients summed over the ranks: what
// every applier must reproduce. Returns the model-dtype parameters of each tensor and the master.
struct Reference {
  std::vector<float> master;
  std::vector<std::vector<char>> params;
};
Reference reference(const ShardLayout& layout, DType dtype) {
  const size_t n = layout.padded_numel();
  Reference ref;
  ref.master.assign(n, 0.0f);
  std::vector<optim::Segment> segments;
  for (size_t t = 0; t < kNumels.size(); ++t) {
    const size_t off = layout.tensors()[t].offset;
    segments.push_back({.begin = off, .end = off + kNumels[t], .group = 0, .param_name = "t" + std::to_string(t)});
    for (size_t e = 0; e < kNumels[t]; ++e) {
      // The master starts from the registered (model dtype) values.
      ref.master[off + e] = dtype == DType::kFloat32 ? initial(t, e) : bf16_bits_to_fp32(fp32_to_bf16_bits(initial(t, e)));
    }
  }
  optim::Optimizer opt(adamw(), n, segments);
  std::vector<float> grad(n), out(n * 2);
  std::vector<char> model(n * dtype_size(dtype));
  for (int s = 0; s < kSteps; ++s) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (size_t t = 0; t < kNumels.size(); ++t) {
      for (size_t e = 0; e < kNumels[t]; ++e) {
        for (int r = 0; r < kRanks; ++r) grad[layout.tensors()[t].offset + e] += grad_of(r, s, t, e);
      }
    }
    opt.step({.master = ref.master.data(), .grad = grad.data(), .grad_dtype = DType::kFloat32,
              .grad_scale = kGradScale, .model_out = model.data(), .model_dtype = dtype});
  }
  const size_t es = dtype_size(dtype);
  for (size_t t = 0; t < kNumels.size(); ++t) {
    const char* p = model.data() + layout.tensors()[t].offset * es;
    ref.params.emplace_back(p, p + kNumels[t] * es);
  }
  return ref;
}

enum class Applier { kDevice, kOffloadPinned, kOffloadPageable };
const char* name(Applier a) {
  return a == Applier::kDevice ? "device" : a == Applier::kOffloadPinned ? "offload, pinned" : "offload, pageable";
}

}  // namespace

TEST_CASE("every applier updates the parameters and the master exactly as one optimizer over the whole model") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const ShardLayout layout(kNumels, kRanks, kLayout, {}, {}, std::vector<DType>(kNumels.size(), dtype));
    const Reference ref = reference(layout, dtype);
    for (Applier kind : {Applier::kDevice, Applier::kOffloadPinned, Applier::kOffloadPageable}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(name(kind));
      testing::run_thread_ranks(kRanks, [&](comm::Communicator& comm) {
        memory::MemoryTracker tracker, host_tracker;
        auto device = memory::make_host_device(tracker, {.threaded_streams = true});
        const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
        const size_t es = dtype_size(dtype);
        std::vector<std::vector<char>> params;
        WritebackTarget target{.layout = &layout};
        ApplierInputs in{.optimizer = adamw(), .layout = &layout, .ownership = &own,
                         .device = device.get(), .timeout = 10s};
        for (size_t t = 0; t < kNumels.size(); ++t) {
          params.emplace_back(kNumels[t] * es);
          for (size_t e = 0; e < kNumels[t]; ++e) testing::store_element(params[t].data() + e * es, dtype, initial(t, e));
          target.tensor_data.push_back(params[t].data());
        }
        for (size_t t = 0; t < kNumels.size(); ++t) {
          in.tensors.push_back({.name = "t" + std::to_string(t), .group = 0, .data = params[t].data(), .dtype = dtype});
        }
        std::unique_ptr<UpdateApplier> applier;
        if (kind == Applier::kDevice) {
          applier = make_device_applier(in);
        } else {
          applier = std::make_unique<OffloadPipeline>(
              in, OffloadConfig{.pinned_staging = kind == Applier::kOffloadPinned, .host_tracker = &host_tracker,
                                .timeout = 10s});
        }
        auto writeback = make_gather_writeback(*device, target, comm, 10s);
        GradReducer grads({.reduce_dtype = dtype, .full_grads = false, .accumulate = true,
                           .timeout = 10s},
                          layout,
                          own, {&comm}, *device, std::vector<UserGrad>(kNumels.size()));
        for (int s = 0; s < kSteps; ++s) {
          grads.begin_micro_step(true);
          for (size_t t = 0; t < kNumels.size(); ++t) {
            char* g = static_cast<char*>(grads.grad(t));
            for (size_t e = 0; e < kNumels[t]; ++e) testing::store_element(g + e * es, dtype, grad_of(comm.rank(), s, t, e));
            grads.tensor_ready(t);
          }
          grads.end_micro_step();
          applier->apply(grads, kGradScale, *writeback);
          device->synchronize(device->compute_stream(), 10s);
          grads.clear();
        }
        for (size_t t = 0; t < kNumels.size(); ++t) {
          CAPTURE(t);
          CHECK(params[t] == ref.params[t]);
        }
        // The master of the owned ranges (padding left out).
        for (size_t b = 0; b < layout.buckets().size(); ++b) {
          const OwnedRange r = own.range(b);
          std::vector<float> master(r.len);
          applier->read_master(r.opt_begin, r.len, master.data());
          for (size_t i = 0; i < r.len; ++i) {
            const size_t f = r.flat_begin + i;
            bool in_tensor = false;
            for (size_t t = 0; t < kNumels.size(); ++t) {
              in_tensor |= f >= layout.tensors()[t].offset && f < layout.tensors()[t].offset + kNumels[t];
            }
            if (in_tensor && master[i] != ref.master[f]) {
              FAIL_CHECK("bucket " << b << " master element " << f << ": " << master[i] << " != " << ref.master[f]);
              break;
            }
          }
        }
        CHECK(applier->optimizer().step_count() == kSteps);
      });
    }
  }
}

TEST_CASE("ShardOptimizer state access: ranges and names checked, bf16 state rounded to nearest even") {
  memory::MemoryTracker tracker;
  auto device = memory::make_host_device(tracker);
  optim::OptimizerOptions o = adamw();
  o.state_dtype = DType::kBFloat16;
  auto opt = make_shard_optimizer(*device, o, 64, {{.begin = 0, .end = 64, .group = 0, .param_name = "w"}}, 10s);
  CHECK(opt->state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  const std::vector<float> in = {1.0f, 1.00390625f /* halfway: rounds to 1 */, 1.01171875f /* halfway: to 1.015625 */};
  opt->write_state("exp_avg", 10, in.size(), in.data());
  std::vector<float> out(in.size());
  opt->read_state("exp_avg", 10, out.size(), out.data());
  CHECK(out == std::vector<float>{1.0f, 1.0f, 1.015625f});
  CHECK(opt->host_state("exp_avg") == nullptr);  // bf16 state is not an fp32 array
  CHECK_THROWS_WITH_AS(opt->read_state("momentum", 0, 1, out.data()), doctest::Contains("momentum"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(opt->read_state("exp_avg", 62, 3, out.data()), doctest::Contains("exp_avg"), InvalidArgument);
}

}  // namespace zero
