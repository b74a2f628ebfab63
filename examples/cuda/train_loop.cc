#include "examples/cuda/train_loop.h"

#include <cuda_runtime.h>

#include <chrono>
#include <memory>

#include "base/check.h"
#include "base/error.h"
#include "examples/cuda/cuda_mlp.h"
#include "examples/mlp.h"
#include "examples/mlp_engine.h"
#include "memory/device.h"

namespace zero::examples::cuda {

MemoryReport train_cuda_mlp(comm::Communicator& nccl, comm::Communicator& host, const EngineOptions& options,
                            const CudaMlpRun& run, const std::function<void(const CudaMlpStep&)>& on_step) {
  using Clock = std::chrono::steady_clock;
  const int rank = nccl.rank(), world = nccl.size();
  if (run.global_batch % world != 0) {
    ZERO_THROW(InvalidArgument, "the global batch {} is not divisible by the world size {}", run.global_batch, world);
  }
  const int local = run.global_batch / world, micro = options.micro_batches;
  if (cudaSetDevice(run.device) != cudaSuccess) {
    ZERO_THROW(InvalidArgument, "GPU {} cannot be used: {}", run.device, cudaGetErrorString(cudaGetLastError()));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    ZERO_THROW(Error, "cudaStreamCreate: {}", cudaGetErrorString(cudaGetLastError()));
  }
  std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)> stream_owner(stream, &cudaStreamDestroy);
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Device> device = memory::make_cuda_device(run.device, tracker, stream);
  memory::Stream& compute = device->compute_stream();

  // The host model gives the initial values (rank 0's win: finalize() broadcasts them).
  Mlp host_model(run.widths, static_cast<uint64_t>(run.seed + 17 * rank));
  SyntheticData data(run.widths.front(), run.widths.back(), static_cast<uint64_t>(run.seed));
  CudaMlp model(host_model, *device, stream);

  Engine engine(EngineComms{&nccl, nullptr, device.get()}, options);
  std::vector<int> ids;
  for (size_t i = 0; i < model.num_params(); ++i) {
    const Mlp::Param& p = host_model.params()[i];
    ids.push_back(engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                    .data = {model.param(i), model.param_numel(i)}, .unit = static_cast<int>(i / 2),
                                    .group = options.optimizer.groups.size() > 1 && !p.decay ? 1 : 0}));
  }
  const Mlp::Access access = unit_scope_access(engine, ids);
  engine.finalize();

  // Per micro-step: its batch staged in page-locked memory and on the device (the staging is
  // rewritten only after the step's loss read-back has waited for every earlier copy).
  const size_t x_bytes = static_cast<size_t>(local) * run.widths.front() * sizeof(float);
  const size_t label_bytes = static_cast<size_t>(local) * sizeof(int);
  std::vector<memory::Buffer> x_stage, label_stage, x_dev, label_dev;
  for (int m = 0; m < micro; ++m) {
    x_stage.push_back(device->allocate_host_staging(x_bytes, memory::Category::kOther));
    label_stage.push_back(device->allocate_host_staging(label_bytes, memory::Category::kOther));
    x_dev.push_back(device->allocate(x_bytes, memory::Category::kOther));
    label_dev.push_back(device->allocate(label_bytes, memory::Category::kOther));
  }
  memory::Buffer loss_sum = device->allocate(sizeof(float), memory::Category::kOther);
  memory::Buffer loss_host = device->allocate_host_staging(sizeof(float), memory::Category::kOther);

  Matrix x;
  std::vector<int> labels;
  for (int step = 0; step < run.steps; ++step) {
    const auto started = Clock::now();
    for (int m = 0; m < micro; ++m) {
      const int64_t first = static_cast<int64_t>(m) * run.global_batch + static_cast<int64_t>(rank) * local;
      data.batch(step, first, local, &x, &labels);
      std::copy(x.data(), x.data() + x.size(), x_stage[m].as<float>());
      std::copy(labels.begin(), labels.end(), label_stage[m].as<int>());
      device->copy(x_dev[m].data(), x_stage[m].data(), x_bytes, compute);
      device->copy(label_dev[m].data(), label_stage[m].data(), label_bytes, compute);
      model.forward(x_dev[m].as<float>(), label_dev[m].as<int>(), local, access);
      device->accumulate(loss_sum.data(), DType::kFloat32, model.loss(), DType::kFloat32, 1, compute);
      model.backward(
          engine.loss_scale(), [&](size_t i) { return engine.grad_as<float>(ids[i]); },
          [&](size_t i) { engine.grad_ready(ids[i]); }, access);
      engine.finish_backward();
    }
    const StepResult r = engine.step();
    device->copy(loss_host.data(), loss_sum.data(), sizeof(float), compute);
    device->fill_zero(loss_sum.data(), sizeof(float), compute);
    device->synchronize(compute, std::chrono::minutes(1));
    double loss = static_cast<double>(*loss_host.as<float>()) / micro;
    host.all_reduce(&loss, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    on_step({.step = step + 1, .loss = loss, .grad_norm = r.grad_norm,
             .seconds = std::chrono::duration<double>(Clock::now() - started).count()});
  }
  MemoryReport report = engine.memory_report();
  device->synchronize(compute, std::chrono::minutes(1));
  return report;
}

}  // namespace zero::examples::cuda
