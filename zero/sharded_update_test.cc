// ShardedUpdate with two ranks as threads, over a real GradReducer and both writebacks: the global
// norm, clipping, the SGD update reaching every rank's parameters, and an overflow that skips the
// step on every rank.
#include "zero/sharded_update.h"
#include "zero/offload_pipeline.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

const std::vector<size_t> kNumels = {100, 30};
const ShardLayoutOptions kLayout{.alignment = 4, .bucket_numel = 64, .block = 16};

struct Result {
  StepResult step;
  std::vector<std::vector<float>> params;
};

// One step of SGD (lr 0.5) on two ranks that both hold gradient `g` everywhere (rank 1 an inf at
// one element when `inf`), replicated or sharded; returns rank `rank`'s view.
enum class Offload { kNone, kPinned, kPageable };

Result one_step(comm::Communicator& comm, bool sharded, float g, float max_norm, bool inf,
                Offload offload = Offload::kNone, bool scaling = true, float bad = INFINITY) {
  memory::MemoryTracker tracker, host_tracker;
  // Offloaded: threaded streams, so the pipeline's copies run on their own threads (TSan checks the
  // events that order them).
  auto device = memory::make_host_device(tracker, {.threaded_streams = offload != Offload::kNone});
  const ShardLayout layout(kNumels, comm.size(), kLayout);
  const ShardOwnership own = sharded ? ShardOwnership::sharded(layout, comm.rank()) : ShardOwnership::replicated(layout);
  Result res;
  std::vector<UpdateTensor> tensors;
  WritebackTarget target{&layout, {}};
  for (size_t t = 0; t < kNumels.size(); ++t) {
    res.params.emplace_back(kNumels[t], 1.0f);
    tensors.push_back({"t" + std::to_string(t), 0, res.params.back().data()});
    target.tensor_data.push_back(res.params.back().data());
  }
  GradReducer red({.full_grads = !sharded, .accumulate = sharded}, layout, own, {&comm}, *device,
                  std::vector<UserGrad>(kNumels.size()));
  auto wb = sharded ? make_gather_writeback(*device, target, comm, std::chrono::seconds(20))
                    : make_local_writeback(*device, target);
  optim::OptimizerOptions oo;
  oo.kind = optim::OptimizerKind::kSgd;
  oo.groups = {optim::Hyper{.lr = 0.5f}};
  const ApplierInputs ai{oo, &layout, &own, device.get(), tensors};
  std::unique_ptr<UpdateApplier> applier;
  if (offload != Offload::kNone) {
    applier = std::make_unique<OffloadPipeline>(
        ai, OffloadConfig{.pinned_staging = offload == Offload::kPinned, .host_tracker = &host_tracker});
  } else {
    applier = make_device_applier(ai);
  }
  UpdateConfig uc;
  uc.max_grad_norm = max_norm;
  ShardedUpdate update(uc, layout, own, comm, *device, std::move(applier), *wb);
  red.begin_micro_step(true);
  for (size_t t = 0; t < kNumels.size(); ++t) {
    float* gp = static_cast<float*>(red.grad(t));
    for (size_t e = 0; e < kNumels[t]; ++e) gp[e] = g;
    if (inf && comm.rank() == 1 && t == 1) gp[3] = bad;
    red.tensor_ready(t);
  }
  red.end_micro_step();
  optim::DynamicLossScaler scaler(optim::LossScalerOptions{.initial_scale = 8.0f, .hysteresis = 1});
  res.step = update.step(red, 1.0f, comm.size(), inf && scaling ? &scaler : nullptr, 0);
  return res;
}

}  // namespace

TEST_CASE("the norm, the clip and the update reach every rank, replicated or sharded, offloaded or not") {
  for (bool sharded : {false, true}) {
    for (float max_norm : {0.0f, 0.1f}) {
      for (Offload offload : {Offload::kNone, Offload::kPinned, Offload::kPageable}) {
      CAPTURE(sharded);
      CAPTURE(max_norm);
      CAPTURE(static_cast<int>(offload));
      testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
        const Result r = one_step(comm, sharded, 0.25f, max_norm, false, offload);
        const double norm = 0.25 * std::sqrt(130.0);  // the mean gradient over both ranks is 0.25
        CHECK(r.step.grad_norm == doctest::Approx(norm).epsilon(1e-12));
        CHECK(r.step.step == 1);
        CHECK_FALSE(r.step.skipped);
        // torch.nn.utils.clip_grad_norm_'s coefficient, exactly.
        const float coef = max_norm > 0 ? static_cast<float>(max_norm / (r.step.grad_norm + 1e-6)) : 1.0f;
        CHECK(r.step.clip_coefficient == coef);
        const double want = 1.0 - 0.5 * 0.25 * coef;
        for (const auto& p : r.params) {
          for (float v : p) REQUIRE(std::fabs(v - want) <= 1e-7 * want);
        }
      });
      }
    }
  }
}

TEST_CASE("an inf on one rank skips the step on every rank and leaves the parameters") {
  for (Offload offload : {Offload::kNone, Offload::kPinned}) {
    CAPTURE(static_cast<int>(offload));
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      const Result r = one_step(comm, true, 0.25f, 1.0f, true, offload);
      CHECK(r.step.skipped);
      CHECK(r.step.step == 0);
      for (const auto& p : r.params) {
        for (float v : p) REQUIRE(v == 1.0f);
      }
    });
  }
}

TEST_CASE("a NaN on one rank without loss scaling fails the step on every rank, naming it") {
  for (float bad : {NAN, INFINITY}) {
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      try {
        one_step(comm, true, 0.25f, 1.0f, true, Offload::kNone, false, bad);
        FAIL("no error");
      } catch (const Error& e) {
        const std::string m = e.what();
        CHECK_MESSAGE(m.find("gradients contain inf or NaN at step 1 (no dynamic loss scaling") != std::string::npos, m);
      }
    });
  }
}

}  // namespace zero
