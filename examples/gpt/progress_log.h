#pragma once
// train_gpt's progress: a line per logged step on stdout for a person, and with --metrics FILE the
// same step as one JSON object per line at full precision for a program (a dashboard's importer,
// the tests, scripts/strategy_validate.sh): what the run measured, without parsing rounded text.
//
//   {"step": 3, "loss": 5.123456789012, "grad_norm": 1.52, "lr": 0.003, "tokens_per_s": 20480.5,
//    "step_ms": 50.1, "gather_ms": 1.2, "reduce_ms": 0.8, "update_ms": 3.0, "memory_bytes": 123456,
//    "activation_bytes": 65536, "bubble": 0.21}              (bubble under a pipeline only)
//   {"step": 50, "validation_loss": 2.369, "unigram_entropy": 4.1}
//
// Only rank 0 keeps one; the numbers are the ones every rank agreed on (the averaged loss, the
// largest rank's memory and activations, the slowest stage's bubble).
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace zero::examples {

struct StepProgress {
  int step = 0;  // 1-based
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0;
  double step_s = 0, gather_s = 0, reduce_s = 0, update_s = 0;
  uint64_t memory_bytes = 0, activation_bytes = 0;
  std::optional<double> bubble;  // the slowest stage's, under a pipeline
  // Bytes every rank together sent this step to ranks of its own node and of other nodes, counted
  // at the transport (comm/peer_traffic.h).
  uint64_t in_node_bytes = 0, between_nodes_bytes = 0;
};

class ProgressLog {
 public:
  // `metrics_path` empty: stdout only. IoError naming --metrics when the file cannot be written.
  explicit ProgressLog(const std::string& metrics_path);
  void step(const StepProgress& p);
  void validation(int step, double loss, double unigram_entropy);

 private:
  void write(const std::string& json_line);
  std::string path_;
  std::ofstream metrics_;
};

}  // namespace zero::examples
