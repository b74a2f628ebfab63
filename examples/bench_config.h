#pragma once
// A benchmark configuration as the bench programs' --configs name it: a stage, optionally followed
// by "+offload" (the optimizer in the host tier) or "+offload-params" (stage 3: the parameter shard
// too), e.g. "2", "3+offload-params".
#include <string>

#include "base/check.h"
#include "zero/engine_options.h"

namespace zero::examples {

struct BenchConfig {
  std::string name;
  int stage = 2;
  bool offload = false;
  bool offload_params = false;

  void apply(EngineOptions& o) const {
    o.stage = stage;
    o.offload.optimizer = offload;
    o.offload.params = offload_params;
  }
};

inline BenchConfig parse_bench_config(const std::string& text) {
  BenchConfig c{text};
  std::string stage = text;
  for (const std::string suffix : {"+offload-params", "+offload"}) {
    if (text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      c.offload = true;
      c.offload_params = suffix == "+offload-params";
      stage = text.substr(0, text.size() - suffix.size());
      break;
    }
  }
  if (stage.size() != 1 || stage[0] < '0' || stage[0] > '3') {
    ZERO_THROW(InvalidArgument, "--configs: '{}' is not a stage 0-3 optionally followed by +offload or +offload-params",
               text);
  }
  c.stage = stage[0] - '0';
  return c;
}

}  // namespace zero::examples
