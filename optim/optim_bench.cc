// optim_bench: throughput of the fused optimizer step against a STREAM-triad bandwidth measured in
// the same run, for each optimizer and precision combination, 1 and 2 threads, 16M and 64M params.
//
//   bazel run -c opt //optim:optim_bench -- [--sizes=16,64] [--threads=1,2] [--reps=5]
//                                           [--kinds=adamw,adam,sgd,adagrad,lion]
//
// Bytes per parameter count each array once per direction (fp32 AdamW: read p, g, m, v and write p,
// m, v = 28 bytes); triad counts 12 bytes per element (read b, c, write a) as STREAM does. Times are
// the best of --reps steps after one warm-up step (STREAM's convention).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "memory/buffer.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace zero::optim {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t next = s.find(',', pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Best-of-reps STREAM triad a[i] = b[i] + s * c[i] over n floats split across the pool; GB/s at 12
// bytes per element.
double triad_gbs(ThreadPool& pool, size_t n, int reps) {
  using memory::Category;
  memory::HostBuffer a(n * 4, Category::kOther), b(n * 4, Category::kOther), c(n * 4, Category::kOther);
  float* pa = static_cast<float*>(a.data());
  float* pb = static_cast<float*>(b.data());
  float* pc = static_cast<float*>(c.data());
  const int t = pool.size();
  pool.run([&](int i) {  // first touch by the thread that streams the range later
    const size_t lo = n * static_cast<size_t>(i) / static_cast<size_t>(t);
    const size_t hi = n * static_cast<size_t>(i + 1) / static_cast<size_t>(t);
    for (size_t k = lo; k < hi; ++k) {
      pa[k] = 0.f;
      pb[k] = 1.f;
      pc[k] = 2.f;
    }
  });
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto start = Clock::now();
    pool.run([&](int i) {
      const size_t lo = n * static_cast<size_t>(i) / static_cast<size_t>(t);
      const size_t hi = n * static_cast<size_t>(i + 1) / static_cast<size_t>(t);
      const float s = 3.f;
      for (size_t k = lo; k < hi; ++k) pa[k] = pb[k] + s * pc[k];
    });
    const double sec = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) best = std::min(best, sec);
  }
  if (pa[n / 2] != 7.f) std::fprintf(stderr, "triad check failed\n");
  return 12.0 * static_cast<double>(n) / best / 1e9;
}

struct Combo {
  const char* name;
  DType grad;
  DType state;
  bool copy_out;
};

const Combo kCombos[] = {
    {"fp32 grads", DType::kFloat32, DType::kFloat32, false},
    {"bf16 grads", DType::kBFloat16, DType::kFloat32, false},
    {"bf16 copy-out", DType::kFloat32, DType::kFloat32, true},
    {"bf16 state", DType::kFloat32, DType::kBFloat16, false},
};

Hyper bench_hyper(OptimizerKind kind) {
  Hyper h;
  h.weight_decay = 0.01f;
  if (kind == OptimizerKind::kSgd) h.momentum = 0.9f;  // with its buffer
  if (kind == OptimizerKind::kAdagrad) h.eps = 1e-10f;
  return h;
}

int states_of(OptimizerKind kind) {
  return (kind == OptimizerKind::kAdamW || kind == OptimizerKind::kAdam) ? 2 : 1;
}

int run(int argc, char** argv) {
  std::vector<size_t> sizes_m = {16, 64};
  std::vector<int> threads = {1, 2};
  int reps = 5;
  std::vector<OptimizerKind> kinds = {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd,
                                      OptimizerKind::kAdagrad, OptimizerKind::kLion};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* key) -> const char* {
      const std::string k = std::string(key) + "=";
      return a.rfind(k, 0) == 0 ? argv[i] + k.size() : nullptr;
    };
    if (const char* v = value("--sizes")) {
      sizes_m.clear();
      for (const std::string& s : split(v)) sizes_m.push_back(std::stoul(s));
    } else if (const char* v = value("--threads")) {
      threads.clear();
      for (const std::string& s : split(v)) threads.push_back(std::stoi(s));
    } else if (const char* v = value("--reps")) {
      reps = std::max(1, std::stoi(v));
    } else if (const char* v = value("--kinds")) {
      kinds.clear();
      for (const std::string& s : split(v)) kinds.push_back(parse_optimizer(s));
    } else {
      std::fprintf(stderr, "usage: optim_bench [--sizes=16,64] [--threads=1,2] [--reps=5] "
                           "[--kinds=adamw,adam,sgd,adagrad,lion]\n");
      return 2;
    }
  }

  fmt::print("optim_bench: {}, {} hardware threads, SIMD path {}\n", cpu_model(),
             std::thread::hardware_concurrency(), simd_path_name(best_simd_path()));
  fmt::print("best of {} steps after a warm-up step; bytes/param count each array once per "
             "direction; triad counts 12 bytes/element\n\n",
             reps);
  for (size_t m : sizes_m) {
    const size_t n = m << 20;
    std::vector<double> triad(threads.size());
    for (size_t t = 0; t < threads.size(); ++t) {
      ThreadPool pool(threads[t]);
      triad[t] = triad_gbs(pool, n, reps);
    }
    fmt::print("{}M params ({} elements). STREAM triad over 3 x {} MiB:", m, n, n * 4 >> 20);
    for (size_t t = 0; t < threads.size(); ++t) {
      fmt::print(" {} thread{}: {:.1f} GB/s;", threads[t], threads[t] == 1 ? "" : "s", triad[t]);
    }
    fmt::print("\n");
    fmt::print("{:<8} {:<14} {:>7} {:>9} {:>11} {:>11} {:>7} {:>8}\n", "optim", "precision",
               "threads", "ms/step", "Mparams/s", "bytes/param", "GB/s", "/triad");

    using memory::Category;
    memory::HostBuffer master_buf(n * 4, Category::kMasterParams), grad32_buf(n * 4, Category::kGrads),
        grad16_buf(n * 2, Category::kGrads), out_buf(n * 2, Category::kParams);
    float* master = static_cast<float*>(master_buf.data());
    float* grad32 = static_cast<float*>(grad32_buf.data());
    uint16_t* grad16 = static_cast<uint16_t*>(grad16_buf.data());
    for (size_t i = 0; i < n; ++i) {
      master[i] = 0.01f * static_cast<float>(i % 1000) - 5.f;
      grad32[i] = 1e-3f * static_cast<float>(i % 777) - 0.3f;
      grad16[i] = fp32_to_bf16_bits(grad32[i]);
    }
    for (OptimizerKind kind : kinds) {
      for (const Combo& combo : kCombos) {
        for (size_t t = 0; t < threads.size(); ++t) {
          OptimizerOptions o;
          o.kind = kind;
          o.groups = {bench_hyper(kind)};
          o.state_dtype = combo.state;
          o.num_threads = threads[t];
          Optimizer opt(o, n, {Segment{0, n, 0, "w", 0}});
          StepInput in;
          in.master = master;
          in.grad = combo.grad == DType::kFloat32 ? static_cast<const void*>(grad32) : grad16;
          in.grad_dtype = combo.grad;
          if (combo.copy_out) {
            in.model_out = out_buf.data();
            in.model_dtype = DType::kBFloat16;
          }
          // Sanity: every sampled element must change (all of them are stepped).
          std::vector<float> before(1024);
          for (size_t k = 0; k < before.size(); ++k) before[k] = master[k * (n / before.size()) + k % 17];
          double best = 1e30;
          for (int r = 0; r < reps + 1; ++r) {
            const auto start = Clock::now();
            opt.step(in);
            const double sec = std::chrono::duration<double>(Clock::now() - start).count();
            if (r > 0) best = std::min(best, sec);
          }
          for (size_t k = 0; k < before.size(); ++k) {
            if (master[k * (n / before.size()) + k % 17] == before[k]) {
              std::fprintf(stderr, "optim_bench: element not updated\n");
              return 1;
            }
          }
          const double bytes = 8.0 + static_cast<double>(dtype_size(combo.grad)) +
                               2.0 * states_of(kind) * static_cast<double>(dtype_size(combo.state)) +
                               (combo.copy_out ? 2.0 : 0.0);
          const double params_per_s = static_cast<double>(n) / best;
          const double gbs = params_per_s * bytes / 1e9;
          fmt::print("{:<8} {:<14} {:>7} {:>9.2f} {:>11.0f} {:>11.0f} {:>7.1f} {:>7.0f}%\n",
                     optimizer_name(kind), combo.name, threads[t], best * 1e3, params_per_s / 1e6,
                     bytes, gbs, 100.0 * gbs / triad[t]);
        }
      }
    }
    fmt::print("\n");
  }
  return 0;
}

}  // namespace
}  // namespace zero::optim

int main(int argc, char** argv) { return zero::optim::run(argc, argv); }
