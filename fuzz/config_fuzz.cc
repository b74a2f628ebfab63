// Fuzz target: the engine config reader (zero/config/engine_config.h), the input being a config file's
// text, ours or DeepSpeed's.
//
// A bad config must end in a zero::Error naming the source and the key. An accepted one, written in
// our format (to_native_json), must read back and write again to the same text: the native format is
// what a program saves to repeat a run, so what one reader accepts the other must reproduce.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"
#include "fuzz/fuzz_check.h"
#include "zero/config/engine_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zero::EngineConfig config;
  try {
    config = zero::parse_engine_config(text, "fuzz.json");
  } catch (const zero::Error&) {
    return 0;
  }
  const std::string native = zero::to_native_json(config);
  zero::EngineConfig back;
  try {
    back = zero::parse_native_config(native, "fuzz-native.json");
  } catch (const zero::Error& e) {
    FUZZ_CHECK(false, "an accepted config, written in our format, is refused: %s\n%s", e.what(), native.c_str());
  }
  const std::string again = zero::to_native_json(back);
  FUZZ_CHECK(again == native, "our format does not read back to itself:\n%s\nreads back as\n%s", native.c_str(),
             again.c_str());
  return 0;
}
