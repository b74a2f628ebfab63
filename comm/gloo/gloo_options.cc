#include "comm/gloo/gloo_options.h"

#include "base/check.h"
#include "comm/schedule_check.h"

namespace zero::comm {

void GlooOptions::validate() const {
  if (interface_or_host.empty()) {
    ZERO_THROW(InvalidArgument, "GlooOptions.interface_or_host must not be empty");
  }
  if (timeout.count() <= 0) {
    ZERO_THROW(InvalidArgument, "GlooOptions.timeout must be positive, got {} ms", timeout.count());
  }
  if (prefix.empty()) ZERO_THROW(InvalidArgument, "GlooOptions.prefix must not be empty");
  if (segment_bytes < 64) {
    ZERO_THROW(InvalidArgument, "GlooOptions.segment_bytes must be at least 64, got {}",
               segment_bytes);
  }
  if (gather_segment_bytes < 64) {
    ZERO_THROW(InvalidArgument, "GlooOptions.gather_segment_bytes must be at least 64, got {}",
               gather_segment_bytes);
  }
  if (eager_bytes > (size_t{16} << 20)) {
    ZERO_THROW(InvalidArgument, "GlooOptions.eager_bytes must be at most 16 MiB, got {}",
               eager_bytes);
  }
  if (segment_depth < 1 || segment_depth > 64) {
    ZERO_THROW(InvalidArgument, "GlooOptions.segment_depth must be in [1, 64], got {}",
               segment_depth);
  }
}

bool runs_as_messages(const GlooOptions& o, size_t payload_bytes) { return payload_bytes <= o.eager_bytes; }

size_t message_capacity(const GlooOptions& o) { return kCallRecordBytes + o.eager_bytes; }

}  // namespace zero::comm
