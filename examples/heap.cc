#include "examples/heap.h"

#include <malloc.h>

namespace zero::examples {

void keep_freed_memory() {
  // Free memory at the heap's top stays mapped (up to 1 GiB), and requests up to 32 MiB (glibc's
  // largest mmap threshold on 64-bit) come from the heap rather than from fresh mappings.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

}  // namespace zero::examples
