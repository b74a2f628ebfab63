// optim_bench: throughput of the fused optimizer step against a STREAM-triad bandwidth measured in
// the same run, for each optimizer and precision combination, 1 and 2 threads, 16M and 64M params.
//
//   bazel run -c opt //optim:optim_bench -- [--sizes=16,64] [--threads=1,2] [--rounds=4]
//                                           [--reps=2] [--kinds=adamw,adam,sgd,adagrad,lion]
//
// Bytes per parameter count each array once per direction (fp32 AdamW: read p, g, m, v and write p,
// m, v = 28 bytes); triad counts 12 bytes per element (read b, c, write a) as STREAM does, although
// its store also reads the line first (write-allocate), so the memory actually moves 16. The
// optimizer's stores go to lines it has just read, so its 28 bytes are all it moves. A second bound
// has fp32 AdamW's exact traffic (read p, g, m, v, write p, m, v in place) with no arithmetic; where
// a core's bandwidth is limited by the misses it keeps in flight (more streams, more misses) it is
// well above the triad. Times are the best over --rounds rounds of --reps steps (each round builds a
// fresh optimizer and takes a warm-up step first); STREAM also reports best times.
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
#include "base/simd.h"
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

// The triad loop, vectorized like a STREAM build at -O3 (plain stores, no streaming stores): a scalar
// loop would be limited by instructions rather than by memory on one core.
void triad_scalar(float* __restrict a, const float* __restrict b, const float* __restrict c,
                  size_t n, float s) {
  for (size_t k = 0; k < n; ++k) a[k] = b[k] + s * c[k];
}

__attribute__((target("avx2,fma"))) void triad_avx2(float* __restrict a, const float* __restrict b,
                                                    const float* __restrict c, size_t n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    _mm256_storeu_ps(a + k, _mm256_add_ps(_mm256_loadu_ps(b + k), _mm256_mul_ps(vs, _mm256_loadu_ps(c + k))));
  }
  triad_scalar(a + k, b + k, c + k, n - k, s);
}

__attribute__((target("avx512f"))) void triad_avx512(float* __restrict a, const float* __restrict b,
                                                     const float* __restrict c, size_t n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    _mm512_storeu_ps(a + k, _mm512_add_ps(_mm512_loadu_ps(b + k), _mm512_mul_ps(vs, _mm512_loadu_ps(c + k))));
  }
  triad_scalar(a + k, b + k, c + k, n - k, s);
}

// AdamW's memory traffic without its arithmetic: read p, g, m, v and write p, m, v in place
// (p += g, m += g, v += g), 28 bytes per element.
void inplace_scalar(float* __restrict p, const float* __restrict g, float* __restrict m,
                    float* __restrict v, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    p[k] += g[k];
    m[k] += g[k];
    v[k] += g[k];
  }
}

__attribute__((target("avx2"))) void inplace_avx2(float* __restrict p, const float* __restrict g,
                                                  float* __restrict m, float* __restrict v, size_t n) {
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 vg = _mm256_loadu_ps(g + k);
    _mm256_storeu_ps(p + k, _mm256_add_ps(_mm256_loadu_ps(p + k), vg));
    _mm256_storeu_ps(m + k, _mm256_add_ps(_mm256_loadu_ps(m + k), vg));
    _mm256_storeu_ps(v + k, _mm256_add_ps(_mm256_loadu_ps(v + k), vg));
  }
  inplace_scalar(p + k, g + k, m + k, v + k, n - k);
}

__attribute__((target("avx512f"))) void inplace_avx512(float* __restrict p, const float* __restrict g,
                                                       float* __restrict m, float* __restrict v,
                                                       size_t n) {
  size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 vg = _mm512_loadu_ps(g + k);
    _mm512_storeu_ps(p + k, _mm512_add_ps(_mm512_loadu_ps(p + k), vg));
    _mm512_storeu_ps(m + k, _mm512_add_ps(_mm512_loadu_ps(m + k), vg));
    _mm512_storeu_ps(v + k, _mm512_add_ps(_mm512_loadu_ps(v + k), vg));
  }
  inplace_scalar(p + k, g + k, m + k, v + k, n - k);
}

void inplace(float* p, const float* g, float* m, float* v, size_t n) {
  switch (best_simd_path()) {
    case SimdPath::kAvx512: return inplace_avx512(p, g, m, v, n);
    case SimdPath::kAvx2: return inplace_avx2(p, g, m, v, n);
    case SimdPath::kScalar: return inplace_scalar(p, g, m, v, n);
  }
}

void triad(float* a, const float* b, const float* c, size_t n, float s) {
  switch (best_simd_path()) {
    case SimdPath::kAvx512: return triad_avx512(a, b, c, n, s);
    case SimdPath::kAvx2: return triad_avx2(a, b, c, n, s);
    case SimdPath::kScalar: return triad_scalar(a, b, c, n, s);
  }
}

// Best-of-reps STREAM triad a[i] = b[i] + s * c[i] over n floats split across the pool; GB/s at 12
// bytes per element.
double triad_gbs(ThreadPool& pool, size_t n, int reps) {
  using memory::Category;
  memory::Buffer a = memory::allocate_host(n * 4, Category::kOther), b = memory::allocate_host(n * 4, Category::kOther),
                 c = memory::allocate_host(n * 4, Category::kOther);
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
      triad(pa + lo, pb + lo, pc + lo, hi - lo, 3.f);
    });
    const double sec = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) best = std::min(best, sec);
  }
  if (pa[n / 2] != 7.f) std::fprintf(stderr, "triad check failed\n");
  return 12.0 * static_cast<double>(n) / best / 1e9;
}

// Best-of-reps GB/s of the 4-read/3-write in-place pattern over n elements per array.
double inplace_gbs(ThreadPool& pool, size_t n, int reps) {
  using memory::Category;
  memory::Buffer p = memory::allocate_host(n * 4, Category::kOther), g = memory::allocate_host(n * 4, Category::kOther),
                 m = memory::allocate_host(n * 4, Category::kOther), v = memory::allocate_host(n * 4, Category::kOther);
  float* pp = static_cast<float*>(p.data());
  float* pg = static_cast<float*>(g.data());
  float* pm = static_cast<float*>(m.data());
  float* pv = static_cast<float*>(v.data());
  const int t = pool.size();
  const auto range = [&](int i, size_t& lo, size_t& hi) {
    lo = n * static_cast<size_t>(i) / static_cast<size_t>(t);
    hi = n * static_cast<size_t>(i + 1) / static_cast<size_t>(t);
  };
  pool.run([&](int i) {
    size_t lo, hi;
    range(i, lo, hi);
    for (size_t k = lo; k < hi; ++k) pg[k] = 1.f;
  });
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto start = Clock::now();
    pool.run([&](int i) {
      size_t lo, hi;
      range(i, lo, hi);
      inplace(pp + lo, pg + lo, pm + lo, pv + lo, hi - lo);
    });
    const double sec = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) best = std::min(best, sec);
  }
  if (pv[n - 1] != static_cast<float>(reps + 1)) std::fprintf(stderr, "in-place check failed\n");
  return 28.0 * static_cast<double>(n) / best / 1e9;
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
  int reps = 2;
  int rounds = 4;
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
    } else if (const char* v = value("--rounds")) {
      rounds = std::max(1, std::stoi(v));
    } else if (const char* v = value("--kinds")) {
      kinds.clear();
      for (const std::string& s : split(v)) kinds.push_back(parse_optimizer(s));
    } else {
      std::fprintf(stderr, "usage: optim_bench [--sizes=16,64] [--threads=1,2] [--rounds=4] "
                           "[--reps=2] [--kinds=adamw,adam,sgd,adagrad,lion]\n");
      return 2;
    }
  }

  fmt::print("optim_bench: {}, {} hardware threads, SIMD path {}\n", cpu_model(),
             std::thread::hardware_concurrency(), simd_path_name(best_simd_path()));
  fmt::print("best of {} rounds x {} steps (each after a warm-up step); bytes/param count each array "
             "once per direction; triad counts 12 bytes/element\n\n",
             rounds, reps);
  for (size_t m : sizes_m) {
    const size_t n = m << 20;
    using memory::Category;
    memory::Buffer master_buf = memory::allocate_host(n * 4, Category::kMasterParams),
                   grad32_buf = memory::allocate_host(n * 4, Category::kGrads),
                   grad16_buf = memory::allocate_host(n * 2, Category::kGrads),
                   out_buf = memory::allocate_host(n * 2, Category::kParams);
    float* master = static_cast<float*>(master_buf.data());
    float* grad32 = static_cast<float*>(grad32_buf.data());
    uint16_t* grad16 = static_cast<uint16_t*>(grad16_buf.data());
    for (size_t i = 0; i < n; ++i) {
      grad32[i] = 1e-3f * static_cast<float>(i % 777) - 0.3f;
      grad16[i] = fp32_to_bf16_bits(grad32[i]);
    }

    // Rounds: each round measures the bounds and every configuration once (a fresh optimizer, a
    // warm-up step, then `reps` timed steps); the table keeps each one's best. Spreading a
    // configuration's samples over the whole run keeps a burst of load from other processes on a
    // shared machine from spoiling all of them.
    std::vector<double> triad(threads.size(), 0.0), same_traffic(threads.size(), 0.0);
    struct Row {
      OptimizerKind kind;
      const Combo* combo;
      size_t thread_index;
      double best = 1e30;
    };
    std::vector<Row> rows;
    for (OptimizerKind kind : kinds) {
      for (const Combo& combo : kCombos) {
        for (size_t t = 0; t < threads.size(); ++t) rows.push_back(Row{kind, &combo, t});
      }
    }
    for (int round = 0; round < rounds; ++round) {
      for (size_t t = 0; t < threads.size(); ++t) {
        ThreadPool pool(threads[t]);
        triad[t] = std::max(triad[t], triad_gbs(pool, n, reps));
        same_traffic[t] = std::max(same_traffic[t], inplace_gbs(pool, n, reps));
      }
      for (Row& row : rows) {
        const Combo& combo = *row.combo;
        OptimizerOptions o;
        o.kind = row.kind;
        o.groups = {bench_hyper(row.kind)};
        o.state_dtype = combo.state;
        o.num_threads = threads[row.thread_index];
        Optimizer opt(o, n, {Segment{0, n, 0, "w", 0}});
        for (size_t i = 0; i < n; ++i) master[i] = 0.01f * static_cast<float>(i % 1000) - 5.f;
        StepInput in;
        in.master = master;
        in.grad = combo.grad == DType::kFloat32 ? static_cast<const void*>(grad32) : grad16;
        in.grad_dtype = combo.grad;
        if (combo.copy_out) {
          in.model_out = out_buf.data();
          in.model_dtype = DType::kBFloat16;
        }
        // Sanity: (nearly) every sampled element changes; a step that skipped part of the shard
        // would leave whole runs unchanged.
        std::vector<float> before(1024);
        const auto sample = [&](size_t k) { return k * (n / before.size()) + k % 17; };
        for (size_t k = 0; k < before.size(); ++k) before[k] = master[sample(k)];
        for (int r = 0; r < reps + 1; ++r) {
          const auto start = Clock::now();
          opt.step(in);
          const double sec = std::chrono::duration<double>(Clock::now() - start).count();
          if (r > 0) row.best = std::min(row.best, sec);
        }
        size_t unchanged = 0;
        for (size_t k = 0; k < before.size(); ++k) unchanged += master[sample(k)] == before[k];
        if (unchanged > before.size() / 64) {
          std::fprintf(stderr, "optim_bench: %zu of %zu sampled elements not updated\n", unchanged,
                       before.size());
          return 1;
        }
      }
    }

    fmt::print("{}M params ({} elements).\n", m, n);
    fmt::print("  STREAM triad a = b + s*c over 3 x {} MiB:", n * 4 >> 20);
    for (size_t t = 0; t < threads.size(); ++t) {
      fmt::print(" {} thread{}: {:.1f} GB/s;", threads[t], threads[t] == 1 ? "" : "s", triad[t]);
    }
    fmt::print("\n  same traffic as fp32 AdamW, no arithmetic (read p,g,m,v, write p,m,v in place):");
    for (size_t t = 0; t < threads.size(); ++t) {
      fmt::print(" {} thread{}: {:.1f} GB/s;", threads[t], threads[t] == 1 ? "" : "s",
                 same_traffic[t]);
    }
    fmt::print("\n");
    fmt::print("{:<8} {:<14} {:>7} {:>9} {:>10} {:>11} {:>7} {:>7} {:>10}\n", "optim", "precision",
               "threads", "ms/step", "Mparams/s", "bytes/param", "GB/s", "/triad", "/same-traf");
    for (const Row& row : rows) {
      const Combo& combo = *row.combo;
      const size_t t = row.thread_index;
      const double bytes = 8.0 + static_cast<double>(dtype_size(combo.grad)) +
                           2.0 * states_of(row.kind) * static_cast<double>(dtype_size(combo.state)) +
                           (combo.copy_out ? 2.0 : 0.0);
      const double params_per_s = static_cast<double>(n) / row.best;
      const double gbs = params_per_s * bytes / 1e9;
      // The same-traffic bound applies to the rows that move exactly its arrays.
      const bool same_pattern = states_of(row.kind) == 2 && combo.grad == DType::kFloat32 &&
                                combo.state == DType::kFloat32 && !combo.copy_out;
      const std::string vs_same =
          same_pattern ? fmt::format("{:.0f}%", 100.0 * gbs / same_traffic[t]) : "-";
      fmt::print("{:<8} {:<14} {:>7} {:>9.2f} {:>10.0f} {:>11.0f} {:>7.1f} {:>6.0f}% {:>10}\n",
                 optimizer_name(row.kind), combo.name, threads[t], row.best * 1e3,
                 params_per_s / 1e6, bytes, gbs, 100.0 * gbs / triad[t], vs_same);
    }
    fmt::print("\n");
  }
  return 0;
}

}  // namespace
}  // namespace zero::optim

int main(int argc, char** argv) { return zero::optim::run(argc, argv); }
