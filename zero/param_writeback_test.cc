// ParamWriteback: the values the optimizer writes into each bucket's owned range reach every
// rank's parameter storage (local: stage 0, one rank owning everything; gather: stages 1-2, every
// rank owning one chunk, with buckets published back to back so the double buffering is used; in
// fp32 and in bf16), or the rank's parameter shard at stage 3. Padding never reaches a tensor.
#include "zero/param_writeback.h"

#include <doctest/doctest.h>

#include <vector>

#include "base/dtype.h"
#include "memory/device.h"
#include "memory/tracker.h"
#include "testing/element.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

const std::vector<size_t> kNumels = {300, 50, 700};
const ShardLayoutOptions kLayout{.alignment = 4, .bucket_numel = 256, .block = 16};

// The new value of flat element f (exact in bf16: small integers).
float new_value(size_t f) { return static_cast<float>(f % 200); }

// Writes every bucket's owned range the way the optimizer does (owned_out, then publish), then
// finish().
void write_all(ParamWriteback& wb, const ShardLayout& layout, const ShardOwnership& own, DType dtype) {
  const size_t es = dtype_size(dtype);
  for (size_t b = 0; b < layout.buckets().size(); ++b) {
    const OwnedRange r = own.range(b);
    char* out = static_cast<char*>(wb.owned_out(b, r));
    for (size_t i = 0; i < r.len; ++i) testing::store_element(out + i * es, dtype, new_value(r.flat_begin + i));
    wb.publish(b);
  }
  wb.finish();
}

// Every tensor holds the new values of its flat range.
void check_tensors(const ShardLayout& layout, const std::vector<std::vector<char>>& tensors, DType dtype) {
  const size_t es = dtype_size(dtype);
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t e = 0; e < kNumels[t]; ++e) {
      const float got = testing::load_element(tensors[t].data() + e * es, dtype);
      if (got != new_value(layout.tensors()[t].offset + e)) {
        FAIL_CHECK("tensor " << t << " element " << e << " holds " << got);
        return;
      }
    }
  }
}

struct Params {
  std::vector<std::vector<char>> storage;
  WritebackTarget target;
  Params(const ShardLayout& layout, DType dtype) {
    for (size_t n : kNumels) storage.emplace_back(n * dtype_size(dtype), char{0x7f});
    target.layout = &layout;
    for (auto& s : storage) target.tensor_data.push_back(s.data());
  }
};

}  // namespace

TEST_CASE("local writeback: one rank owning every bucket") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    CAPTURE(dtype_name(dtype));
    memory::MemoryTracker tracker;
    auto device = memory::make_host_device(tracker);
    const ShardLayout layout(kNumels, 1, kLayout, {}, {}, std::vector<DType>(kNumels.size(), dtype));
    const ShardOwnership own = ShardOwnership::replicated(layout);
    Params p(layout, dtype);
    auto wb = make_local_writeback(*device, p.target);
    write_all(*wb, layout, own, dtype);
    check_tensors(layout, p.storage, dtype);
  }
}

TEST_CASE("gather writeback: every rank's tensors get every rank's chunks") {
  for (int ranks : {2, 3}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      CAPTURE(ranks);
      CAPTURE(dtype_name(dtype));
      testing::run_thread_ranks(ranks, [&](comm::Communicator& comm) {
        memory::MemoryTracker tracker;
        memory::HostDeviceOptions threaded;
        threaded.threaded_streams = true;
        auto device = memory::make_host_device(tracker, threaded);
        const ShardLayout layout(kNumels, comm.size(), kLayout, {}, {}, std::vector<DType>(kNumels.size(), dtype));
        const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
        Params p(layout, dtype);
        StepTimings timings;
        auto wb = make_gather_writeback(*device, p.target, comm, 10s, &timings);
        for (int step = 0; step < 2; ++step) {  // the buffers are reused from step to step
          write_all(*wb, layout, own, dtype);
          device->synchronize(device->compute_stream(), 10s);
          check_tensors(layout, p.storage, dtype);
        }
        CHECK(timings.gathered_bytes == 2 * layout.padded_numel() * dtype_size(dtype));
      });
    }
  }
}

TEST_CASE("shard writeback: new values land in the rank's shard in optimizer-space order") {
  const ShardLayout layout(kNumels, 2, kLayout);
  for (int rank : {0, 1}) {
    const ShardOwnership own = ShardOwnership::sharded(layout, rank);
    std::vector<float> shard(own.numel(), -1.0f);
    auto wb = make_shard_writeback(shard.data(), layout);
    write_all(*wb, layout, own, DType::kFloat32);
    for (size_t b = 0; b < layout.buckets().size(); ++b) {
      const OwnedRange r = own.range(b);
      for (size_t i = 0; i < r.len; ++i) CHECK(shard[r.opt_begin + i] == new_value(r.flat_begin + i));
    }
  }
}

}  // namespace zero
