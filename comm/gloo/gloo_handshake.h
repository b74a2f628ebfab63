#pragma once
// How the ranks of a new Gloo communicator meet: the full-mesh context through the store, then one
// round in which every rank checks that the others share the settings that shape the messages.
#include <memory>
#include <string>

#include <gloo/context.h>

#include "comm/gloo/gloo_options.h"
#include "comm/store/store.h"

namespace zero::comm {

// Connects `size` ranks under `prefix` (unique to the communicator instance) and verifies that
// every rank agrees on the settings that shape the messages: the schedule check `check` (a rank
// checking alone would wait for headers nobody sends) and options' segment_bytes,
// gather_segment_bytes and eager_bytes (a receive smaller than the message that lands in it aborts
// Gloo). Collective. Throws CommError "gloo rank R: ..." naming the first rank that differs and
// both values, or why connecting or the handshake failed.
std::shared_ptr<gloo::Context> connect_and_handshake(const std::shared_ptr<Store>& store,
                                                     const std::string& prefix, int rank, int size,
                                                     const GlooOptions& options, bool check);

}  // namespace zero::comm
