// Compiled by nodiscard_scope_test.sh, never built into anything: with HOLD defined every scope is
// held (must compile); otherwise one is dropped on the floor (must not, under -Werror=unused-result).
#include "zero/engine.h"

void loop(zero::Engine& engine) {
#if defined(HOLD)
  auto fwd = engine.gather(0);
  auto bwd = engine.gather_for_backward(0);
  auto quiet = engine.no_sync();
#elif defined(DROP_NO_SYNC)
  engine.no_sync();
#else
  engine.gather_for_backward(0);
#endif
}
