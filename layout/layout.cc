#include "layout/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <functional>

#include "base/check.h"
#include "base/error.h"

namespace zero {

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kPp: return "pp";
    case MeshDim::kDp: return "dp";
    case MeshDim::kTp: return "tp";
  }
  return "?";
}

MeshOrder parse_mesh_order(const std::string& text) {
  MeshOrder order{};
  size_t n = 0, at = 0;
  bool seen[3] = {false, false, false};
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    bool known = false;
    for (MeshDim d : {MeshDim::kPp, MeshDim::kDp, MeshDim::kTp}) {
      if (item != mesh_dim_name(d)) continue;
      known = !seen[static_cast<int>(d)] && n < 3;
      if (known) {
        seen[static_cast<int>(d)] = true;
        order[n++] = d;
      }
    }
    if (!known) {
      ZERO_THROW(InvalidArgument, "mesh order '{}': expected pp, dp and tp once each, slowest-varying first (e.g. "
                 "pp,dp,tp), at '{}'", text, item);
    }
    at = comma + 1;
  }
  if (n != 3) ZERO_THROW(InvalidArgument, "mesh order '{}': expected pp, dp and tp once each", text);
  return order;
}

std::string mesh_order_name(const MeshOrder& order) {
  return fmt::format("{},{},{}", mesh_dim_name(order[0]), mesh_dim_name(order[1]), mesh_dim_name(order[2]));
}

namespace {

// The one description of the fields: each reads its text into a Layout and writes it back.
struct Field {
  const char* name;
  std::function<void(Layout&, std::string_view value, const std::string& where)> set;
  std::function<std::string(const Layout&)> text;
  LayoutFieldKind kind = LayoutFieldKind::kText;
  bool engine = false;  // kept with the engine's options in a config file
};

int count(std::string_view value, const std::string& where, int lo, int hi) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi) {
    ZERO_THROW(InvalidArgument, "{}={} is not an integer in [{}, {}]", where, value, lo, hi);
  }
  return v;
}

bool flag(std::string_view value, const std::string& where) {
  if (value.empty() || value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  ZERO_THROW(InvalidArgument, "{}={} is not true or false", where, value);
}

constexpr int kMaxCount = 1 << 20;

Field int_field(const char* name, int Layout::*member, int lo, bool engine = false) {
  return {name, [member, lo](Layout& l, std::string_view v, const std::string& w) { l.*member = count(v, w, lo, kMaxCount); },
          [member](const Layout& l) { return std::to_string(l.*member); }, LayoutFieldKind::kInteger, engine};
}

Field bool_field(const char* name, bool Layout::*member, bool engine = false) {
  return {name, [member](Layout& l, std::string_view v, const std::string& w) { l.*member = flag(v, w); },
          [member](const Layout& l) { return std::string(l.*member ? "true" : "false"); }, LayoutFieldKind::kBoolean,
          engine};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> all = [] {
    std::vector<Field> f;
    f.push_back(int_field("dp", &Layout::dp, 0));
    f.push_back(int_field("shard", &Layout::shard, 0));
    f.push_back(int_field("tp", &Layout::tp, 1));
    f.push_back(int_field("pp", &Layout::pp, 1));
    f.push_back({"order",
                 [](Layout& l, std::string_view v, const std::string& w) {
                   try {
                     l.order = parse_mesh_order(std::string(v));
                   } catch (const InvalidArgument& e) {
                     ZERO_THROW(InvalidArgument, "{}: {}", w, e.what());
                   }
                 },
                 [](const Layout& l) { return mesh_order_name(l.order); }});
    f.push_back({"stage",
                 [](Layout& l, std::string_view v, const std::string& w) { l.stage = count(v, w, 0, 3); },
                 [](const Layout& l) { return std::to_string(l.stage); }, LayoutFieldKind::kInteger, true});
    f.push_back(bool_field("offload_optimizer", &Layout::offload_optimizer, true));
    f.push_back(bool_field("offload_params", &Layout::offload_params, true));
    f.push_back(int_field("micro_batches", &Layout::micro_batches, 1, true));
    f.push_back({"schedule",
                 [](Layout& l, std::string_view v, const std::string& w) {
                   if (v != "gpipe" && v != "1f1b" && v != "interleaved" && v != "zb-h1" && v != "zb-v") {
                     ZERO_THROW(InvalidArgument, "{}={} is not gpipe, 1f1b, interleaved, zb-h1 or zb-v", w, v);
                   }
                   l.schedule = std::string(v);
                   if (v == "zb-v" && l.chunks == 1) l.chunks = 2;  // its V has two chunks per rank
                 },
                 [](const Layout& l) { return l.schedule; }});
    f.push_back(int_field("chunks", &Layout::chunks, 1));
    f.push_back(bool_field("sequence_parallel", &Layout::sequence_parallel));
    f.push_back(bool_field("recompute", &Layout::recompute));
    return f;
  }();
  return all;
}

// The text form's short names.
std::string_view canonical(std::string_view name) {
  if (name == "m") return "micro_batches";
  if (name == "sp") return "sequence_parallel";
  if (name == "offload") return "offload_optimizer";
  return name;
}

const Field* find_field(std::string_view name) {
  for (const Field& f : fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string field_list() {
  std::string s;
  for (const Field& f : fields()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

}  // namespace

const std::vector<std::string>& layout_fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Field& f : fields()) n.emplace_back(f.name);
    return n;
  }();
  return names;
}

bool is_engine_field(std::string_view field) {
  const Field* f = find_field(field);
  return f != nullptr && f->engine;
}

void set_layout_field(Layout& layout, std::string_view field, std::string_view value, const std::string& source) {
  const Field* f = find_field(canonical(field));
  if (f == nullptr) ZERO_THROW(InvalidArgument, "{}: unknown layout field '{}' (the fields: {})", source, field, field_list());
  f->set(layout, value, fmt::format("{}: {}", source, f->name));
}

LayoutFieldKind layout_field_kind(std::string_view field) {
  const Field* f = find_field(field);
  ZERO_CHECK(f != nullptr, "layout_field_kind: unknown field '{}'", field);
  return f->kind;
}

std::string layout_field_text(const Layout& layout, std::string_view field) {
  const Field* f = find_field(field);
  ZERO_CHECK(f != nullptr, "layout_field_text: unknown field '{}'", field);
  return f->text(layout);
}

void validate(const Layout& l, const std::string& source) {
  auto fail = [&](const std::string& why) { ZERO_THROW(InvalidArgument, "{}: {}", source, why); };
  if (l.offload_params && (l.stage != 3 || !l.offload_optimizer)) {
    fail(fmt::format("offload_params needs stage 3 with offload_optimizer (got stage {}{})", l.stage,
                     l.offload_optimizer ? "" : ", optimizer not offloaded"));
  }
  if (l.shard != 0) {
    if (l.stage == 0) fail(fmt::format("shard={} needs a sharded stage (1-3); stage 0 shards nothing", l.shard));
    if (l.dp != 0 && l.dp % l.shard != 0) fail(fmt::format("shard={} does not divide dp={}", l.shard, l.dp));
  }
  if (l.sequence_parallel && l.tp == 1) fail("sequence_parallel needs tp above 1 (it splits the sequence over the tp ranks)");
  if (l.schedule == "zb-v") {
    if (l.chunks != 2) fail(fmt::format("the zb-v schedule runs 2 chunks per rank in a V (schedule=zb-v, chunks={})", l.chunks));
  } else if ((l.schedule == "interleaved") != (l.chunks > 1)) {
    fail(fmt::format("the interleaved schedule and chunks above 1 go together (schedule={}, chunks={})", l.schedule,
                     l.chunks));
  }
  if (l.chunks > 1 && l.pp == 1) fail(fmt::format("chunks={} needs pp above 1", l.chunks));
}

Layout with_world(const Layout& layout, int world_size, const std::string& source) {
  Layout l = layout;
  const int model = l.tp * l.pp;
  if (l.dp == 0) {
    if (world_size % model != 0) {
      ZERO_THROW(InvalidArgument, "{}: tp {} x pp {} does not divide the {} ranks", source, l.tp, l.pp, world_size);
    }
    l.dp = world_size / model;
  }
  if (l.world() != world_size) {
    ZERO_THROW(InvalidArgument, "{}: dp {} x tp {} x pp {} is {} ranks, but the world has {} (dp=0: what the world leaves)",
               source, l.dp, l.tp, l.pp, l.world(), world_size);
  }
  validate(l, source);
  return l;
}

Layout parse_layout(const std::string& text, const Layout& base) {
  Layout l = base;
  const std::string source = fmt::format("layout '{}'", text);
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item(text.data() + at, comma - at);
    const size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq), value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    size_t next = comma + 1;
    // "order=pp,dp,tp" carries commas of its own: every order is three two-letter names and two commas.
    if (key == "order" && eq != std::string_view::npos) {
      const size_t end = std::min(at + eq + 1 + std::string_view("pp,dp,tp").size(), text.size());
      value = std::string_view(text.data() + at + eq + 1, end - (at + eq + 1));
      next = end + 1;
    }
    if (key.empty()) ZERO_THROW(InvalidArgument, "{}: an empty item", source);
    set_layout_field(l, key, value, source);
    at = next;
  }
  validate(l, source);
  return l;
}

std::string layout_text(const Layout& layout) {
  const Layout defaults;
  std::string s;
  for (const Field& f : fields()) {
    const std::string v = f.text(layout);
    if (v == f.text(defaults)) continue;
    s += (s.empty() ? "" : ",") + std::string(f.name) + (v == "true" ? "" : "=" + v);
  }
  return s.empty() ? "dp=1" : s;
}

std::string describe(const Layout& l) {
  std::string s = fmt::format("dp {} x tp {} x pp {}, stage {}", l.dp, l.tp, l.pp, l.stage);
  if (l.pp > 1) {
    s += fmt::format(", {} x {}", l.schedule, l.micro_batches);
    if (l.chunks > 1) s += fmt::format(", {} chunks", l.chunks);
  } else if (l.micro_batches > 1) {
    s += fmt::format(", {} micro-batches", l.micro_batches);
  }
  if (l.shard != 0) s += fmt::format(", shard groups of {}", l.shard);
  if (l.sequence_parallel) s += ", sp";
  if (l.offload_optimizer) s += l.offload_params ? ", offload (and parameters)" : ", offload";
  if (l.recompute) s += ", recompute";
  if (l.order != Layout{}.order) s += ", order " + mesh_order_name(l.order);
  return s;
}

std::string layout_key(const Layout& l) {
  std::string s = fmt::format("dp{}.tp{}.pp{}.z{}.m{}", l.dp, l.tp, l.pp, l.stage, l.micro_batches);
  if (l.pp > 1) s += "." + l.schedule;
  if (l.chunks > 1) s += fmt::format(".v{}", l.chunks);
  if (l.shard != 0) s += fmt::format(".hs{}", l.shard);
  if (l.sequence_parallel) s += ".sp";
  if (l.offload_optimizer) s += l.offload_params ? ".offp" : ".off";
  if (l.recompute) s += ".rc";
  if (l.order != Layout{}.order) {
    s += ".";
    for (MeshDim d : l.order) s += mesh_dim_name(d);
  }
  return s;
}

}  // namespace zero
