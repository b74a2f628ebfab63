#pragma once
// Keeps the memory a training program frees mapped for its next micro-batch (glibc's malloc).
//
// The hand-written models allocate each micro-batch's activations afresh and free them after its
// backward. glibc returns the top of its heap to the system once more than its trim threshold lies
// free there, and serves large requests with fresh mappings; either way the next micro-batch's
// activations come back as new pages, each zero-filled on its first touch. A loop that frees and
// reallocates the same sizes every micro-batch then pays thousands of page faults a step, or not,
// depending on what else happens to sit at the heap's top (at one rank, ZeRO stages 0-1 did and
// 2-3 did not: docs/strategy.md). Called once, first thing in a program's main, before any thread
// starts.
namespace zero::examples {

void keep_freed_memory();

}  // namespace zero::examples
