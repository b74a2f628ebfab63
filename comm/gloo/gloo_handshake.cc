#include "comm/gloo/gloo_handshake.h"

#include <cstdint>
#include <exception>
#include <vector>

#include "base/check.h"
#include "comm/gloo/gloo_collectives.h"

namespace zero::comm {
namespace {

std::shared_ptr<gloo::Context> connect(const std::shared_ptr<Store>& store, const std::string& prefix,
                                       int rank, int size, const GlooOptions& options) {
  try {
    return connect_gloo_context(store, prefix, rank, size, options.interface_or_host,
                                options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    ZERO_THROW(CommError, "gloo rank {}: connecting {} ranks under '{}' failed: {}", rank, size,
               prefix, e.what());
  }
}

void handshake(gloo::Context& ctx, const std::string& prefix, const GlooOptions& options,
               bool check) {
  const int rank = ctx.rank;
  DirectOptions d;
  d.tag = 0xffffffffu;
  d.deadline = SteadyClock::now() + options.timeout;
  struct Settings {
    uint64_t check, segment_bytes, gather_segment_bytes, eager_bytes;
  };
  const Settings mine{check ? 1u : 0u, options.segment_bytes, options.gather_segment_bytes,
                      options.eager_bytes};
  std::vector<Settings> all(static_cast<size_t>(ctx.size));
  Graveyard graveyard;
  d.graveyard = &graveyard;
  try {
    exchange_records(ctx, &mine, all.data(), sizeof(Settings), d);
  } catch (const std::exception& e) {
    // The failed exchange's buffers are released only once the connections are closed: until
    // then Gloo's loop thread may still signal them.
    if (!graveyard.empty()) {
      ctx.closeConnections();
      graveyard.clear();
    }
    ZERO_THROW(CommError, "gloo rank {}: handshake under '{}' failed: {}", rank, prefix,
               e.what());
  }
  for (int r = 0; r < ctx.size; ++r) {
    if (all[r].check != mine.check) {
      ZERO_THROW(CommError,
                 "gloo rank {}: schedule check is {} here but {} on rank {} (set "
                 "ZERO_COMM_CHECK and GlooOptions.check_schedule the same on every rank)",
                 rank, check ? "on" : "off", all[r].check ? "on" : "off", r);
    }
    if (all[r].segment_bytes != mine.segment_bytes ||
        all[r].gather_segment_bytes != mine.gather_segment_bytes ||
        all[r].eager_bytes != mine.eager_bytes) {
      ZERO_THROW(CommError,
                 "gloo rank {}: GlooOptions segment_bytes/gather_segment_bytes/eager_bytes are "
                 "{}/{}/{} here but {}/{}/{} on rank {} (they must match on every rank)",
                 rank, mine.segment_bytes, mine.gather_segment_bytes, mine.eager_bytes,
                 all[r].segment_bytes, all[r].gather_segment_bytes, all[r].eager_bytes, r);
    }
  }
}

}  // namespace

std::shared_ptr<gloo::Context> connect_and_handshake(const std::shared_ptr<Store>& store,
                                                     const std::string& prefix, int rank, int size,
                                                     const GlooOptions& options, bool check) {
  std::shared_ptr<gloo::Context> context = connect(store, prefix, rank, size, options);
  handshake(*context, prefix, options, check);
  return context;
}

}  // namespace zero::comm
