// tp_bytes: the payload bytes (count x dtype size of the operation's largest buffer) each of the
// GPT's tensor-parallel collectives moves, per layer and per step, measured by the communicator,
// next to Megatron-LM's formulas:
//
//   per layer, without sequence parallelism: 2 all-reduces of s*b*h forward and 2 backward;
//   with it: the same bytes as 4 all-gathers and 4 reduce-scatters of s*b*h (2 of each each way).
//   per step, besides: the embedding's sum and the head's (s*b*h each, as an all-reduce each way or
//   as a reduce-scatter and an all-gather), and the vocabulary-parallel loss's row maximum (s*b)
//   and sums (2 s*b).
//
// The model runs one forward and backward on rank 0 of a planning communicator of tp ranks
// (comm/planning_communicator.h: nothing sent, every call counted); a layer's bytes are those of a
// model with two layers less those of one with one.
//
//   bazel-bin/examples/bench/tp_bytes [--n-embd 256 --n-head 8 --block-size 128 --batch 2 --vocab 8192]
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "comm/planning_communicator.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_model.h"

namespace zero {
namespace {

using Tallies = std::map<std::string, comm::CollectiveTally>;

// One forward and backward of a `layers`-layer model split over a planning tp group.
Tallies measure(examples::GptConfig c, int layers, int tp, bool sp, int batch) {
  c.n_layer = layers;
  const examples::Gpt whole(c, 1);
  // Addressing nothing: the collectives leave the buffers as they are (the values do not matter).
  comm::PlanningCommunicator group(0, tp, [](const void*, size_t) { return false; }, memory::DeviceKind::kHost);
  examples::Gpt model(whole, {&group, sp});
  std::vector<std::vector<float>> grads;
  for (const auto& p : model.params()) grads.emplace_back(p.values.size(), 0.0f);
  examples::Gpt::Access access;
  access.grad = [&](size_t i) { return grads[i].data(); };
  const size_t n = static_cast<size_t>(batch) * static_cast<size_t>(c.block_size);
  std::vector<int> tokens(n), targets(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int>(i * 7 % static_cast<size_t>(c.vocab_size));
    targets[i] = static_cast<int>(i * 13 % static_cast<size_t>(c.vocab_size));
  }
  model.forward(tokens, targets, batch, c.block_size, access);
  model.backward(1.0f, access);
  return group.tallies();
}

struct Row {
  std::string op;
  uint64_t calls = 0, bytes = 0;
};

std::vector<Row> rows(const Tallies& t, const Tallies* minus = nullptr) {
  std::vector<Row> out;
  for (const auto& [op, v] : t) {
    Row r{op, v.calls, v.payload_bytes};
    if (minus != nullptr && minus->count(op)) {
      r.calls -= minus->at(op).calls;
      r.bytes -= minus->at(op).payload_bytes;
    }
    if (r.calls > 0) out.push_back(r);
  }
  return out;
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  examples::GptConfig c;
  c.n_embd = flags.get_int("n-embd", 256);
  c.n_head = flags.get_int("n-head", 8);
  c.block_size = flags.get_int("block-size", 128);
  c.vocab_size = flags.get_int("vocab", 8192);
  const int batch = flags.get_int("batch", 2);
  const int layers = flags.get_int("n-layer", 12);  // for the per-step rows
  flags.check_all_used();
  const uint64_t s = static_cast<uint64_t>(c.block_size), b = static_cast<uint64_t>(batch),
                 h = static_cast<uint64_t>(c.n_embd), L = static_cast<uint64_t>(layers), fp32 = 4;
  const uint64_t sbh = s * b * h * fp32, sb = s * b * fp32;
  std::printf("GPT n_embd %d, %d heads, vocabulary %d, s %d, b %d, fp32: s*b*h = %llu bytes\n\n", c.n_embd, c.n_head,
              c.vocab_size, c.block_size, batch, static_cast<unsigned long long>(sbh));
  std::printf("%-8s %-3s %-6s %-15s %6s %14s %14s %6s\n", "scope", "tp", "sp", "collective", "calls", "bytes",
              "formula", "equal");
  bool all_equal = true;
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      const Tallies one = measure(c, 1, tp, sp, batch), two = measure(c, 2, tp, sp, batch),
                    full = measure(c, layers, tp, sp, batch);
      // Megatron's per-layer formula, and the per-step one with the embedding, head and loss.
      std::map<std::string, std::pair<uint64_t, uint64_t>> layer_formula, step_formula;  // op -> calls, bytes
      if (!sp) {
        layer_formula["all_reduce"] = {4, 4 * sbh};
        step_formula["all_reduce"] = {4 * L + 4, (4 * L + 2) * sbh + 3 * sb};
      } else {
        layer_formula["all_gather"] = {4, 4 * sbh};
        layer_formula["reduce_scatter"] = {4, 4 * sbh};
        step_formula["all_gather"] = {4 * L + 2, (4 * L + 2) * sbh};
        step_formula["reduce_scatter"] = {4 * L + 2, (4 * L + 2) * sbh};
        step_formula["all_reduce"] = {2, 3 * sb};
      }
      auto print = [&](const char* scope, const std::vector<Row>& got,
                       const std::map<std::string, std::pair<uint64_t, uint64_t>>& want) {
        std::map<std::string, Row> by_op;
        for (const Row& r : got) by_op[r.op] = r;
        for (const auto& [op, f] : want) by_op.emplace(op, Row{op, 0, 0});
        for (const auto& [op, r] : by_op) {
          const auto it = want.find(op);
          const uint64_t fb = it == want.end() ? 0 : it->second.second;
          const uint64_t fc = it == want.end() ? 0 : it->second.first;
          const bool equal = r.bytes == fb && r.calls == fc;
          all_equal &= equal;
          std::printf("%-8s %-3d %-6s %-15s %6llu %14llu %14llu %6s\n", scope, tp, sp ? "on" : "off", op.c_str(),
                      static_cast<unsigned long long>(r.calls), static_cast<unsigned long long>(r.bytes),
                      static_cast<unsigned long long>(fb), equal ? "yes" : "NO");
        }
      };
      print("layer", rows(two, &one), layer_formula);
      print(fmt::format("step L{}", layers).c_str(), rows(full), step_formula);
    }
  }
  std::printf("\n%s\n", all_equal ? "every count equals the formula" : "SOME COUNTS DIFFER FROM THE FORMULA");
  return all_equal ? 0 : 1;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("tp_bytes", zero::run, argc, argv); }
