#include "examples/gpt/progress_log.h"

#include <fmt/format.h>

#include <cstdio>

#include "base/check.h"
#include "memory/tracker.h"

namespace zero::examples {

ProgressLog::ProgressLog(const std::string& metrics_path) : path_(metrics_path) {
  if (path_.empty()) return;
  metrics_.open(path_, std::ios::trunc);
  if (!metrics_) ZERO_THROW(IoError, "--metrics {}: cannot open it for writing", path_);
}

void ProgressLog::write(const std::string& line) {
  if (path_.empty()) return;
  metrics_ << line << '\n';
  metrics_.flush();  // a run stopped midway keeps the steps it logged
  if (!metrics_) ZERO_THROW(IoError, "--metrics {}: cannot write to it", path_);
}

void ProgressLog::step(const StepProgress& p) {
  std::printf("step %4d | loss %.4f | norm %.2f | lr %.2e | %7.0f tok/s | %6.1f ms (gather %.1f, reduce %.1f, "
              "update %.1f) | mem/rank %s%s | activations %s | sent %s in nodes, %s between\n",
              p.step, p.loss, p.grad_norm, p.lr, p.tokens_per_s, 1e3 * p.step_s, 1e3 * p.gather_s, 1e3 * p.reduce_s,
              1e3 * p.update_s, memory::format_bytes(p.memory_bytes).c_str(),
              p.bubble ? fmt::format(" | bubble {:.1f}%", 100 * *p.bubble).c_str() : "",
              memory::format_bytes(p.activation_bytes).c_str(), memory::format_bytes(p.in_node_bytes).c_str(),
              memory::format_bytes(p.between_nodes_bytes).c_str());
  std::fflush(stdout);
  // {:.17g}: every double reads back to itself.
  write(fmt::format("{{\"step\": {}, \"loss\": {:.17g}, \"grad_norm\": {:.9g}, \"lr\": {:.9g}, \"tokens_per_s\": {:.6g}, "
                    "\"step_ms\": {:.6g}, \"gather_ms\": {:.6g}, \"reduce_ms\": {:.6g}, \"update_ms\": {:.6g}, "
                    "\"memory_bytes\": {}, \"activation_bytes\": {}, \"in_node_bytes\": {}, "
                    "\"between_nodes_bytes\": {}{}}}",
                    p.step, p.loss, p.grad_norm, p.lr, p.tokens_per_s, 1e3 * p.step_s, 1e3 * p.gather_s,
                    1e3 * p.reduce_s, 1e3 * p.update_s, p.memory_bytes, p.activation_bytes, p.in_node_bytes,
                    p.between_nodes_bytes,
                    p.bubble ? fmt::format(", \"bubble\": {:.6g}", *p.bubble) : ""));
}

void ProgressLog::validation(int step, double loss, double unigram_entropy) {
  std::printf("step %4d | validation loss %.4f (unigram entropy %.4f)\n", step, loss, unigram_entropy);
  std::fflush(stdout);
  write(fmt::format("{{\"step\": {}, \"validation_loss\": {:.17g}, \"unigram_entropy\": {:.9g}}}", step, loss,
                    unigram_entropy));
}

}  // namespace zero::examples
