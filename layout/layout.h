#pragma once
// One way to run a model on a world of ranks, in one type that every part reads and writes: the
// config file's "parallel" section (zero/config), the planner's search and --write-config
// (parallel/strategy), the training programs' flags, the checkpoint manifest's "layout" (zero/checkpoint)
// and the device mesh (comm/mesh.h, built from it). Below every one of them: it depends on base/
// alone, so zero/ and comm/ may include it.
//
// Each field has one name, the same in the text form, in JSON and (with '-' for '_') in flags:
//
//   dp, shard          data-parallel ranks (0: as many as the world holds, world / (tp x pp), as
//                      torchtitan's -1; with_world() resolves it), and the ranks one shard group holds (hybrid sharding,
//                      HSDP: state sharded within groups of `shard` consecutive dp ranks, replicated
//                      across them; 0: one group of all dp ranks)
//   tp, pp             tensor-parallel ranks per group, pipeline stages
//   order              the mesh's dimensions slowest-varying first ("pp,dp,tp": tp groups are
//                      consecutive ranks; comm/mesh_layout.h draws it)
//   stage              ZeRO stage 0-3
//   offload_optimizer  the fp32 master and optimizer state in host memory (stages 1-3)
//   offload_params     stage 3's parameter shard in host memory too
//   micro_batches      micro-batches per data-parallel rank and step: one after another
//                      (accumulation) at pp 1, through the schedule above
//   schedule, chunks   the pipeline's: gpipe, 1f1b, interleaved (chunks above 1: rank s holds virtual
//                      stages s, pp + s, 2 pp + s, ...), zb-h1 or zb-v (2 chunks in a V: rank s holds
//                      virtual stages s and 2 pp - 1 - s; setting the schedule sets chunks=2)
//   sequence_parallel  the tp groups also split the residual stream's rows
//   recompute          each block's forward runs again in its backward (activation checkpointing)
//
// The text form is "key=value" items joined by commas, in any order; a flag item alone means true
// ("dp=2,tp=2,pp=2,stage=3,micro_batches=4,sequence_parallel"), and "m" and "sp" are short for
// micro_batches and sequence_parallel, "offload" for offload_optimizer.
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace zero {

enum class MeshDim { kPp, kDp, kTp };
using MeshOrder = std::array<MeshDim, 3>;  // slowest-varying first
const char* mesh_dim_name(MeshDim dim);    // "pp", "dp", "tp"
// "pp,dp,tp" -> the order; InvalidArgument naming the text unless it names pp, dp and tp once each.
MeshOrder parse_mesh_order(const std::string& text);
std::string mesh_order_name(const MeshOrder& order);  // "pp,dp,tp"

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int stage = 0;
  int micro_batches = 1;
  std::string schedule = "1f1b";
  int chunks = 1;
  bool sequence_parallel = false;
  bool offload_optimizer = false;
  bool recompute = false;
  bool offload_params = false;
  int shard = 0;
  MeshOrder order = {MeshDim::kPp, MeshDim::kDp, MeshDim::kTp};

  int world() const { return dp * tp * pp; }
  int virtual_stages() const { return pp * chunks; }
  int shard_group_size() const { return shard == 0 ? dp : shard; }
  bool operator==(const Layout&) const = default;
};

// `layout` on a world of `world_size` ranks: dp 0 becomes world_size / (tp x pp). InvalidArgument
// "<source>: ..." naming the sizes when tp x pp does not divide the world or dp x tp x pp is not it.
Layout with_world(const Layout& layout, int world_size, const std::string& source);

// The layout's field names in their fixed order (the JSON writer's, the flags').
const std::vector<std::string>& layout_fields();
// The fields a config file keeps with the engine's options (stage, offload_optimizer,
// offload_params, micro_batches) rather than in its "parallel" section.
bool is_engine_field(std::string_view field);

// Sets one field from its text ("2", "true", "gpipe", "tp,dp,pp"; a flag's empty text is true).
// InvalidArgument "<source>: <field>=<value> ..." for an unknown field or a value of the wrong kind or
// out of range (a count below 1, a stage outside 0-3, an unknown schedule); the rules between
// fields are validate()'s.
void set_layout_field(Layout& layout, std::string_view field, std::string_view value, const std::string& source);
// What a field's value is (JSON writes it as an integer, a boolean or a string).
enum class LayoutFieldKind { kInteger, kBoolean, kText };
LayoutFieldKind layout_field_kind(std::string_view field);
// One field's value as text, the form set_layout_field reads back.
std::string layout_field_text(const Layout& layout, std::string_view field);

// The rules between fields, InvalidArgument "<source>: ..." naming them: offload_params needs stage
// 3 with offload_optimizer (the engine's rule); a shard group divides dp and needs a
// sharded stage; sequence parallelism needs tp above 1; chunks above 1 and the interleaved schedule
// go together and need pp above 1.
void validate(const Layout& layout, const std::string& source);

// The text form: items over `base` (each field keeps base's value unless the text names it), then
// validate(). InvalidArgument naming the text and the item.
Layout parse_layout(const std::string& text, const Layout& base = {});
// The text form of the fields that differ from Layout{} ("dp=2,tp=2,stage=3"; "dp=1" for the default).
std::string layout_text(const Layout& layout);
// "dp 2 x tp 2 x pp 2, stage 3, 1f1b x 4, sp, offload, recompute" (the schedule only above pp 1;
// "interleaved x 4, 2 chunks").
std::string describe(const Layout& layout);
// A short key: "dp2.tp2.pp2.z3.m4.1f1b.sp.off.rc" ("...m4.interleaved.v2...").
std::string layout_key(const Layout& layout);

}  // namespace zero
