#pragma once
// Property checks inside the fuzz targets. A parser that accepts an input must hand back something
// the code after it can rely on (offsets within the file, a re-encoding equal to the input); when it
// does not, the target stops the process so that libFuzzer saves the input as a crash, and the
// replay test (fuzz/replay_test.cc) fails on it. Not an exception: the targets catch the library's
// errors, and an abort cannot be mistaken for one.
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "fuzz property failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
