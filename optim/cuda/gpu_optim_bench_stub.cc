// gpu_optim_bench in a CPU build: says how to get the real one.
#include <cstdio>

int main() {
  std::printf("gpu_optim_bench: skipped: a CPU build (build with --config=cuda)\n");
  return 0;
}
