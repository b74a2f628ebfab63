// Replays a fuzz target's seed corpus (fuzz/corpus/<target>) and its regressions
// (fuzz/regressions/<target>: inputs that once found a bug) through the target's own entry point,
// built with the ordinary toolchain and without libFuzzer, so that every finding stays fixed in the
// normal test run. FUZZ_TARGET (set in fuzz/BUILD) names the target; the files are the test's data
// and sit in its runfiles, relative to the directory Bazel starts the test in.
//
// The entry point returns 0 for every input and lets no exception out (the library's errors are
// caught inside it); a broken property aborts, which fails the test with the input's path on stderr.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// FUZZ_TARGET is a bare name (-DFUZZ_TARGET=store_wire), which needs no quoting through Bazel.
#define FUZZ_STR2(x) #x
#define FUZZ_STR(x) FUZZ_STR2(x)
#define FUZZ_NAME FUZZ_STR(FUZZ_TARGET)

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> inputs(const std::string& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void replay(const std::vector<fs::path>& files) {
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read ", p.string());
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Named before the call: an abort inside it leaves this as the last line of the log.
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", p.c_str(), bytes.size());
    // A heap copy of exactly the input's size, as libFuzzer passes it, so that a read past the end is
    // a read past an allocation (which ASan builds report), and never a null pointer for an empty one.
    const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
    const uint8_t empty = 0;
    const uint8_t* data = copy.empty() ? &empty : copy.data();
    CAPTURE(p.string());
    int rc = -1;
    CHECK_NOTHROW(rc = LLVMFuzzerTestOneInput(data, copy.size()));
    CHECK(rc == 0);
  }
}

}  // namespace

TEST_CASE("the seed corpus replays clean") {
  const std::vector<fs::path> files = inputs(std::string("fuzz/corpus/") + FUZZ_NAME);
  // An empty corpus would make this test pass without testing anything (a glob that matched nothing).
  REQUIRE_MESSAGE(files.size() >= 5, "fuzz/corpus/" FUZZ_NAME " has only ", files.size(), " inputs");
  replay(files);
}

TEST_CASE("every regression input replays clean") {
  replay(inputs(std::string("fuzz/regressions/") + FUZZ_NAME));
}
