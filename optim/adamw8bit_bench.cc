// adamw8bit_bench: 8-bit AdamW's step (optim/adamw8bit.h) against the bound of its own memory
// traffic, measured in the same run, and fp32 AdamW's step beside it.
//
//   bazel run -c opt --config=native //optim:adamw8bit_bench -- [--sizes=16,64] [--threads=1,2] [--rounds=4]
//       [--simd=scalar|avx2|avx512]   (the step's and fp32 AdamW's path; default the CPU's best)
//
// 8-bit AdamW moves 16 bytes per parameter and a little more: read p and g (fp32) and the two codes,
// write p and the two codes, plus 16 bytes of absmax per 256-element block (read and written). The
// bound runs exactly that traffic with no arithmetic (p += g, codes += 1, absmax += 1, in place),
// vectorized; the step splits its blocks over the threads as the engine does not (yet): it shows
// what the kernel reaches. Times are the best over --rounds rounds of 2 steps after a warm-up.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu.h"
#include "base/simd.h"
#include "memory/buffer.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "optim/step_coeffs.h"
#include "optim/thread_pool.h"

namespace zero::optim {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBlock = 256;

std::vector<size_t> parse_list(const std::string& s) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t next = s.find(',', pos);
    out.push_back(std::stoul(s.substr(pos, next - pos)));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

// The traffic of one 8-bit step over [lo, hi) with no arithmetic: p += g on 16 floats, each code
// += 1 on 16 bytes per moment, and per block both absmax += 1; AVX-512 where the CPU has it.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void same_traffic_avx512(float* p, const float* g, uint8_t* m,
                                                                             uint8_t* v, float* ma, float* va,
                                                                             size_t lo, size_t hi) {
  const __m128i one = _mm_set1_epi8(1);
  for (size_t k = lo; k < hi; k += 16) {
    const __mmask16 t = hi - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (hi - k)) - 1);
    _mm512_mask_storeu_ps(p + k, t, _mm512_add_ps(_mm512_maskz_loadu_ps(t, p + k), _mm512_maskz_loadu_ps(t, g + k)));
    _mm_mask_storeu_epi8(m + k, t, _mm_add_epi8(_mm_maskz_loadu_epi8(t, m + k), one));
    _mm_mask_storeu_epi8(v + k, t, _mm_add_epi8(_mm_maskz_loadu_epi8(t, v + k), one));
    if (k % kBlock == 0) {
      ma[k / kBlock] += 1.0f;
      va[k / kBlock] += 1.0f;
    }
  }
}

void same_traffic_scalar(float* __restrict p, const float* __restrict g, uint8_t* __restrict m, uint8_t* __restrict v,
                         float* __restrict ma, float* __restrict va, size_t lo, size_t hi) {
  for (size_t k = lo; k < hi; ++k) {
    p[k] += g[k];
    m[k] = static_cast<uint8_t>(m[k] + 1);
    v[k] = static_cast<uint8_t>(v[k] + 1);
    if (k % kBlock == 0) {
      ma[k / kBlock] += 1.0f;
      va[k / kBlock] += 1.0f;
    }
  }
}

void same_traffic(float* p, const float* g, uint8_t* m, uint8_t* v, float* ma, float* va, size_t lo, size_t hi) {
  if (best_simd_path() == SimdPath::kAvx512) return same_traffic_avx512(p, g, m, v, ma, va, lo, hi);
  same_traffic_scalar(p, g, m, v, ma, va, lo, hi);
}

// [lo, hi) of thread i of t, on block boundaries.
void range_of(size_t n, int i, int t, size_t& lo, size_t& hi) {
  const size_t blocks = (n + kBlock - 1) / kBlock;
  lo = std::min(n, blocks * static_cast<size_t>(i) / static_cast<size_t>(t) * kBlock);
  hi = std::min(n, blocks * static_cast<size_t>(i + 1) / static_cast<size_t>(t) * kBlock);
}

template <typename Fn>
double best_of(int rounds, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < rounds + 1; ++r) {
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

int run(int argc, char** argv) {
  std::vector<size_t> sizes = {16, 64}, threads = {1, 2};
  int rounds = 4;
  SimdPath path = best_simd_path();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes = parse_list(a.substr(8));
    } else if (a.rfind("--threads=", 0) == 0) {
      threads = parse_list(a.substr(10));
    } else if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::max(1, std::stoi(a.substr(9)));
    } else if (a.rfind("--simd=", 0) == 0) {
      path = parse_simd_path(a.substr(7));
    } else {
      std::fprintf(stderr, "usage: adamw8bit_bench [--sizes=16,64] [--threads=1,2] [--rounds=4] [--simd=scalar|avx2|avx512]\n");
      return 2;
    }
  }
  fmt::print("adamw8bit_bench: {} hardware threads, SIMD path {}; best of {} rounds\n",
             std::thread::hardware_concurrency(), simd_path_name(path), rounds);
  const double bytes8 = 16.0 + 16.0 / kBlock, bytes32 = 28.0;
  fmt::print("{:>6} {:>7} {:<22} {:>9} {:>10} {:>11} {:>7} {:>9}\n", "Mparams", "threads", "step", "ms/step",
             "Mparams/s", "bytes/param", "GB/s", "/bound");
  for (size_t m : sizes) {
    const size_t n = m << 20, blocks = (n + kBlock - 1) / kBlock;
    using memory::Category;
    memory::Buffer pb = memory::allocate_host(n * 4, Category::kOther), gb = memory::allocate_host(n * 4, Category::kOther),
                   mb = memory::allocate_host(n, Category::kOther), vb = memory::allocate_host(n, Category::kOther),
                   mab = memory::allocate_host(blocks * 4, Category::kOther),
                   vab = memory::allocate_host(blocks * 4, Category::kOther);
    float* p = static_cast<float*>(pb.data());
    float* g = static_cast<float*>(gb.data());
    auto* mc = static_cast<uint8_t*>(mb.data());
    auto* vc = static_cast<uint8_t*>(vb.data());
    float* ma = static_cast<float*>(mab.data());
    float* va = static_cast<float*>(vab.data());
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
      g[i] = 1e-3f * static_cast<float>(i % 777) - 0.3f;
      mc[i] = vc[i] = 0;
    }
    std::fill(ma, ma + blocks, 0.0f);
    std::fill(va, va + blocks, 0.0f);
    const Hyper h{.weight_decay = 0.01f};
    for (size_t t : threads) {
      ThreadPool pool(static_cast<int>(t));
      const int nt = static_cast<int>(t);
      const double bound = best_of(rounds, [&] {
        pool.run([&](int i) {
          size_t lo, hi;
          range_of(n, i, nt, lo, hi);
          same_traffic(p, g, mc, vc, ma, va, lo, hi);
        });
      });
      std::fill(mc, mc + n, 0);
      std::fill(vc, vc + n, 0);
      std::fill(ma, ma + blocks, 0.0f);
      std::fill(va, va + blocks, 0.0f);
      int64_t step = 0;
      const double eight = best_of(rounds, [&] {
        const StepCoeffs c = compute_step_coeffs(OptimizerKind::kAdamW8bit, h, ++step, 1.0f, false);
        pool.run([&](int i) {
          size_t lo, hi;
          range_of(n, i, nt, lo, hi);
          StepInput in{.master = p + lo, .grad = g + lo};
          adamw8bit_step(in, hi - lo, kBlock, c, {mc + lo, ma + lo / kBlock}, {vc + lo, va + lo / kBlock}, path);
        });
      });
      OptimizerOptions o;
      o.groups = {h};
      o.num_threads = nt;
      o.simd_path = path;
      Optimizer fp32(o, n, {Segment{0, n, 0, "w", 0}});
      const double full = best_of(rounds, [&] { fp32.step(StepInput{.master = p, .grad = g}); });
      const double bound_gbs = bytes8 * static_cast<double>(n) / bound / 1e9;
      const auto row = [&](const char* name, double sec, double bytes, const std::string& vs) {
        fmt::print("{:>6} {:>7} {:<22} {:>9.2f} {:>10.0f} {:>11.2f} {:>7.1f} {:>9}\n", m, t, name, sec * 1e3,
                   static_cast<double>(n) / sec / 1e6, bytes, bytes * static_cast<double>(n) / sec / 1e9, vs);
      };
      row("same traffic, no math", bound, bytes8, "bound");
      row("adamw8bit", eight, bytes8, fmt::format("{:.0f}%", 100.0 * bytes8 * static_cast<double>(n) / eight / 1e9 / bound_gbs));
      row("adamw (fp32 state)", full, bytes32, "-");
    }
  }
  return 0;
}

}  // namespace
}  // namespace zero::optim

int main(int argc, char** argv) { return zero::optim::run(argc, argv); }
