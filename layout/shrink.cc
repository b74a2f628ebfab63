#include "layout/shrink.h"

#include <algorithm>

#include "base/check.h"

namespace zero {

namespace {

// The largest hybrid-sharding group size that divides dp and is at most the planned one (0 stays 0:
// one group of every dp rank).
int shard_for(int planned_shard, int dp) {
  if (planned_shard == 0) return 0;
  for (int s = std::min(planned_shard, dp); s > 1; --s) {
    if (dp % s == 0) return s == dp ? 0 : s;
  }
  return 0;
}

}  // namespace

ShrunkLayout shrink_layout(const Layout& planned, int global_batch, int world, const std::string& source) {
  const int model = planned.tp * planned.pp;
  if (planned.dp < 1 || model < 1 || planned.micro_batches < 1) {
    ZERO_THROW(InvalidArgument, "{}: the planned layout has dp {} x tp {} x pp {}, {} micro-batches (dp resolved)",
               source, planned.dp, planned.tp, planned.pp, planned.micro_batches);
  }
  const int per_step = planned.dp * planned.micro_batches;
  if (global_batch < 1 || global_batch % per_step != 0) {
    ZERO_THROW(InvalidArgument, "{}: the global batch of {} rows does not split into dp {} x {} micro-batches", source,
               global_batch, planned.dp, planned.micro_batches);
  }
  if (world < model) {
    ZERO_THROW(InvalidArgument, "{}: no layout fits {} rank(s): one copy of the model takes tp {} x pp {} = {}", source,
               world, planned.tp, planned.pp, model);
  }
  const int rows = global_batch / per_step;  // per micro-batch, kept
  for (int dp = world / model; dp >= 1; --dp) {
    if (global_batch % (dp * rows) != 0) continue;
    const int micro_batches = global_batch / (dp * rows);
    if (planned.schedule == "interleaved" && planned.pp > 1 && micro_batches % planned.pp != 0) continue;
    Layout l = planned;
    l.dp = dp;
    l.micro_batches = micro_batches;
    l.shard = shard_for(planned.shard, dp);
    validate(l, source);
    return {.layout = l, .spares = world - l.world()};
  }
  ZERO_THROW(InvalidArgument,
             "{}: no layout fits {} rank(s): no dp of at most {} splits the global batch of {} rows into micro-batches "
             "of {} rows{}",
             source, world, world / model, global_batch, rows,
             planned.schedule == "interleaved" && planned.pp > 1 ? fmt::format(" (a multiple of pp {} of them)", planned.pp)
                                                                 : "");
}

}  // namespace zero
