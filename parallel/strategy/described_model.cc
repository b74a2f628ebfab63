#include "parallel/strategy/described_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "base/check.h"
#include "parallel/pipeline/stage_cut.h"
#include "parallel/strategy/kernel_times.h"
#include "parallel/tensor/vocab_parallel.h"
#include "zero/config/json_reading.h"

namespace zero::strategy {
namespace {

using config_internal::Context;
using config_internal::fail;
using config_internal::json;
using config_internal::ObjectReader;
using config_internal::require;

// Bytes, FLOPs and element counts above 2^53 lose their units in a double; no model comes near.
constexpr double kLargest = 9007199254740992.0;

double non_negative(const json& j, const std::string& path, const Context& ctx) {
  const double v = config_internal::read_number(j, path, ctx);
  if (!std::isfinite(v) || v < 0) fail(ctx, fmt::format("{} must be >= 0, got {}", path, v));
  if (v > kLargest) fail(ctx, fmt::format("{} must be at most 2^53, got {}", path, v));
  return v;
}

const json& array_at(ObjectReader& r, const std::string& key) {
  const json& j = require(r, key);
  if (!j.is_array()) config_internal::fail_type(j, r.path(key), r.ctx(), "a list");
  return j;
}

// One of `names` (their index), else an error listing them.
int choice(const json& j, const std::string& path, const Context& ctx, const std::vector<std::string>& names) {
  const std::string s = config_internal::read_string(j, path, ctx, "a string");
  for (size_t k = 0; k < names.size(); ++k) {
    if (s == names[k]) return static_cast<int>(k);
  }
  fail(ctx, fmt::format("{} must be one of {}, got \"{}\"", path, fmt::join(names, ", "), s));
}

DescribedTensor read_tensor(const json& j, const std::string& path, const Context& ctx) {
  ObjectReader r(j, path, ctx);
  DescribedTensor t;
  t.name = config_internal::read_string(require(r, "name"), r.path("name"), ctx, "a string");
  if (t.name.empty()) fail(ctx, fmt::format("{} is empty", r.path("name")));
  const json& shape = require(r, "shape");
  if (!shape.is_array()) config_internal::fail_type(shape, r.path("shape"), ctx, "a list of sizes");
  if (shape.empty()) fail(ctx, fmt::format("{} needs at least one dimension", r.path("shape")));
  double elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const std::string dpath = fmt::format("{}[{}]", r.path("shape"), d);
    t.shape.push_back(config_internal::read_integer(shape[d], dpath, ctx, 1, INT64_MAX));
    elements *= static_cast<double>(t.shape.back());
  }
  if (elements > kLargest) fail(ctx, fmt::format("{}: more than 2^53 elements", r.path("shape")));
  if (const json* s = r.find("split")) {
    const std::string spath = r.path("split");
    if (!s->is_object() && !s->is_string()) {
      config_internal::fail_type(*s, spath, ctx, "a name (replicated, column, row, vocab) or {\"dim\", \"blocks\"}");
    }
    if (s->is_object()) {
      ObjectReader sr(*s, spath, ctx);
      const int dim = config_internal::read_int(require(sr, "dim"), sr.path("dim"), ctx, 0);
      const json* b = sr.find("blocks");
      const int blocks = b != nullptr ? config_internal::read_int(*b, sr.path("blocks"), ctx, 1) : 1;
      sr.finish();
      t.tp = TpPlacement::split(dim, blocks);
    } else {
      switch (choice(*s, spath, ctx, {"replicated", "column", "row", "vocab"})) {
        case 1: t.tp = TpPlacement::split(0); break;
        case 2: t.tp = TpPlacement::split(1); break;
        case 3: t.tp = TpPlacement::split(0), t.vocab = true; break;
        default: break;
      }
    }
    if (t.tp.is_split() && t.tp.dim >= static_cast<int>(t.shape.size())) {
      fail(ctx, fmt::format("{} splits dimension {} of a {}-dimensional tensor", spath, t.tp.dim, t.shape.size()));
    }
  }
  if (const json* d = r.find("dtype")) {
    t.dtype = config_internal::read_name(*d, r.path("dtype"), ctx, "a dtype name", parse_dtype);
    if (*t.dtype != DType::kFloat32 && *t.dtype != DType::kBFloat16 && *t.dtype != DType::kFloat16) {
      fail(ctx, fmt::format("{} must be fp32, bf16 or fp16, got {}", r.path("dtype"), dtype_name(*t.dtype)));
    }
  }
  if (const json* d = r.find("no_decay")) t.no_decay = config_internal::read_bool(*d, r.path("no_decay"), ctx);
  if (const json* d = r.find("tied_to")) {
    t.tied_to = config_internal::read_string(*d, r.path("tied_to"), ctx, "a string");
  }
  r.finish();
  return t;
}

ActivationTerm read_term(const json& j, const std::string& path, const Context& ctx) {
  ObjectReader r(j, path, ctx);
  ActivationTerm t;
  const json* token = r.find("per_token");
  const json* micro = r.find("per_micro_batch");
  if ((token == nullptr) == (micro == nullptr)) {
    fail(ctx, fmt::format("{} needs one of per_token and per_micro_batch", path));
  }
  t.per = token ? ActivationTerm::Per::kToken : ActivationTerm::Per::kMicroBatch;
  t.bytes = non_negative(token ? *token : *micro, r.path(token ? "per_token" : "per_micro_batch"), ctx);
  if (const json* s = r.find("split")) {
    t.split = static_cast<ActivationTerm::Split>(choice(*s, r.path("split"), ctx, {"none", "tp", "sequence", "vocab"}));
  }
  if (const json* w = r.find("when")) {
    t.when = static_cast<ActivationTerm::When>(choice(*w, r.path("when"), ctx, {"any", "tp1", "tp>1"}));
  }
  r.finish();
  return t;
}

std::vector<ActivationTerm> read_terms(ObjectReader& r, const std::string& key) {
  std::vector<ActivationTerm> out;
  if (r.find(key) == nullptr) return out;
  const json& list = array_at(r, key);
  for (size_t k = 0; k < list.size(); ++k) {
    out.push_back(read_term(list[k], fmt::format("{}[{}]", r.path(key), k), r.ctx()));
  }
  return out;
}

DescribedLayer read_layer(ObjectReader& parent, const std::string& key) {
  const json& j = require(parent, key);
  const Context& ctx = parent.ctx();
  ObjectReader r(j, parent.path(key), ctx);
  DescribedLayer l;
  if (r.find("tensors")) {
    const json& list = array_at(r, "tensors");
    for (size_t k = 0; k < list.size(); ++k) l.tensors.push_back(read_tensor(list[k], fmt::format("{}[{}]", r.path("tensors"), k), ctx));
  }
  if (const json* f = r.find("flops_per_token")) {
    ObjectReader fr(*f, r.path("flops_per_token"), ctx);
    l.forward = non_negative(require(fr, "forward"), fr.path("forward"), ctx);
    l.backward_input = non_negative(require(fr, "backward_input"), fr.path("backward_input"), ctx);
    l.backward_weight = non_negative(require(fr, "backward_weight"), fr.path("backward_weight"), ctx);
    fr.finish();
  }
  if (const json* t = r.find("tp")) {
    ObjectReader tr(*t, r.path("tp"), ctx);
    // A layer enters and leaves a few regions (a transformer block two); more is a typo.
    if (const json* e = tr.find("enter")) l.enter = config_internal::read_int(*e, tr.path("enter"), ctx, 0, 64);
    if (const json* e = tr.find("leave")) l.leave = config_internal::read_int(*e, tr.path("leave"), ctx, 0, 64);
    if (tr.find("all_reduces_per_token")) {
      const json& list = array_at(tr, "all_reduces_per_token");
      for (size_t k = 0; k < list.size(); ++k) {
        l.all_reduces_per_token.push_back(non_negative(list[k], fmt::format("{}[{}]", tr.path("all_reduces_per_token"), k), ctx));
      }
    }
    tr.finish();
  }
  l.activations = read_terms(r, "activations");
  if (r.find("weight_reads")) l.weight_reads = read_terms(r, "weight_reads");
  l.weight_work = read_terms(r, "weight_work");
  r.finish();
  return l;
}

}  // namespace

int64_t vocabulary(const ModelDescription& m) {
  for (const DescribedLayer* l : {&m.embedding, &m.head}) {
    for (const DescribedTensor& t : l->tensors) {
      if (t.vocab) return t.shape[0];
    }
  }
  return 0;
}

ModelDescription parse_model_description(std::string_view text, const std::string& source) {
  const Context ctx{source, "parallel/strategy/described_model.h"};
  const json root = config_internal::parse_json(text, source);
  if (!root.is_object()) fail(ctx, "a model description is a JSON object");
  ObjectReader r(root, "", ctx);
  ModelDescription m;
  m.name = config_internal::read_string(require(r, "name"), "name", ctx, "a string");
  if (const json* c = r.find("comment")) config_internal::read_string(*c, "comment", ctx, "a string");
  if (const json* k = r.find("kernels")) m.kernels = config_internal::read_string(*k, "kernels", ctx, "a string");
  m.sequence_length = config_internal::read_int(require(r, "sequence_length"), "sequence_length", ctx, 1);
  m.hidden = config_internal::read_int(require(r, "hidden"), "hidden", ctx, 1);
  m.heads = config_internal::read_int(require(r, "heads"), "heads", ctx, 1);
  m.kv_heads = r.find("kv_heads") ? config_internal::read_int(*r.find("kv_heads"), "kv_heads", ctx, 1, m.heads) : m.heads;
  if (m.heads % m.kv_heads != 0) fail(ctx, fmt::format("kv_heads {} does not divide heads {}", m.kv_heads, m.heads));
  m.blocks = config_internal::read_int(require(r, "blocks"), "blocks", ctx, 1, 1 << 20);
  if (const json* d = r.find("activation_dtype")) {
    m.activation_dtype = config_internal::read_name(*d, "activation_dtype", ctx, "a dtype name", parse_dtype);
    if (m.activation_dtype != DType::kFloat32 && m.activation_dtype != DType::kBFloat16 &&
        m.activation_dtype != DType::kFloat16) {
      fail(ctx, fmt::format("activation_dtype must be fp32, bf16 or fp16, got {}", dtype_name(m.activation_dtype)));
    }
  }
  m.embedding = read_layer(r, "embedding");
  m.block = read_layer(r, "block");
  m.head = read_layer(r, "head");
  r.finish();
  // Names once each (the engine keys its tensors by name); a tie names an embedding tensor of the
  // same shape, once, and only the head ties (the tensor is the embedding's: its dtype and group too).
  std::set<std::string> names, tied;
  const int64_t vocab = vocabulary(m);
  const std::pair<const char*, const DescribedLayer*> layers[] = {
      {"embedding", &m.embedding}, {"block", &m.block}, {"head", &m.head}};
  for (const auto& [layer, l] : layers) {
    for (size_t k = 0; k < l->tensors.size(); ++k) {
      const DescribedTensor& t = l->tensors[k];
      const std::string path = fmt::format("{}.tensors[{}]", layer, k);
      if (!names.insert(fmt::format("{}/{}", l == &m.block ? "block" : "", t.name)).second) {
        fail(ctx, fmt::format("{}: a second tensor named {}", path, t.name));
      }
      if (t.tied_to.empty()) continue;
      if (l != &m.head) fail(ctx, fmt::format("{}.tied_to: only the head's tensors tie to the embedding's", path));
      const DescribedTensor* to = nullptr;
      for (const DescribedTensor& e : m.embedding.tensors) {
        if (e.name == t.tied_to) to = &e;
      }
      if (to == nullptr) fail(ctx, fmt::format("{}.tied_to: no embedding tensor named {}", path, t.tied_to));
      if (to->shape != t.shape || to->tp != t.tp || to->vocab != t.vocab) {
        fail(ctx, fmt::format("{}.tied_to: {} has another shape or split than the embedding's {}", path, t.name, t.tied_to));
      }
      if (t.dtype || t.no_decay) {
        fail(ctx, fmt::format("{}: a tied tensor is {}, whose dtype and no_decay it takes", path, t.tied_to));
      }
      if (!tied.insert(t.tied_to).second) fail(ctx, fmt::format("{}.tied_to: {} is tied twice", path, t.tied_to));
    }
    const std::pair<const char*, const std::vector<ActivationTerm>*> lists[] = {
        {"activations", &l->activations},
        {"weight_reads", l->weight_reads ? &*l->weight_reads : nullptr},
        {"weight_work", &l->weight_work}};
    for (const auto& [name, terms] : lists) {
      for (size_t k = 0; terms != nullptr && k < terms->size(); ++k) {
        if ((*terms)[k].split == ActivationTerm::Split::kVocab && vocab == 0) {
          fail(ctx, fmt::format("{}.{}[{}].split: \"vocab\" needs a tensor split \"vocab\"", layer, name, k));
        }
      }
    }
  }
  return m;
}

ModelDescription load_model_description(const std::string& path) {
  return parse_model_description(config_internal::read_text_file(path, "model description"), path);
}

namespace {

// The writer keeps the fields in the order the header lists them.
using ojson = nlohmann::ordered_json;

// A whole number as an integer (bytes and FLOPs read better so), anything else as it is.
ojson number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  return v;
}

ojson tensor_json(const DescribedTensor& t) {
  ojson j = {{"name", t.name}, {"shape", t.shape}};
  if (t.vocab) {
    j["split"] = "vocab";
  } else if (t.tp.is_split() && t.tp.blocks == 1 && t.tp.dim <= 1) {
    j["split"] = t.tp.dim == 0 ? "column" : "row";
  } else if (t.tp.is_split()) {
    j["split"] = {{"dim", t.tp.dim}, {"blocks", t.tp.blocks}};
  }
  if (t.dtype) j["dtype"] = dtype_name(*t.dtype);
  if (t.no_decay) j["no_decay"] = true;
  if (!t.tied_to.empty()) j["tied_to"] = t.tied_to;
  return j;
}

ojson terms_json(const std::vector<ActivationTerm>& terms) {
  ojson out = ojson::array();
  for (const ActivationTerm& t : terms) {
    ojson j = {{t.per == ActivationTerm::Per::kToken ? "per_token" : "per_micro_batch", number(t.bytes)}};
    static const char* splits[] = {"none", "tp", "sequence", "vocab"};
    static const char* whens[] = {"any", "tp1", "tp>1"};
    if (t.split != ActivationTerm::Split::kNone) j["split"] = splits[static_cast<int>(t.split)];
    if (t.when != ActivationTerm::When::kAny) j["when"] = whens[static_cast<int>(t.when)];
    out.push_back(std::move(j));
  }
  return out;
}

ojson layer_json(const DescribedLayer& l) {
  ojson j = ojson::object();
  if (!l.tensors.empty()) {
    j["tensors"] = ojson::array();
    for (const DescribedTensor& t : l.tensors) j["tensors"].push_back(tensor_json(t));
  }
  if (l.forward && l.backward_input && l.backward_weight) {
    j["flops_per_token"] = {{"forward", number(*l.forward)}, {"backward_input", number(*l.backward_input)},
                            {"backward_weight", number(*l.backward_weight)}};
  }
  if (l.enter > 0 || l.leave > 0 || !l.all_reduces_per_token.empty()) {
    ojson tp = ojson::object();
    if (l.enter > 0) tp["enter"] = l.enter;
    if (l.leave > 0) tp["leave"] = l.leave;
    if (!l.all_reduces_per_token.empty()) {
      tp["all_reduces_per_token"] = ojson::array();
      for (double b : l.all_reduces_per_token) tp["all_reduces_per_token"].push_back(number(b));
    }
    j["tp"] = std::move(tp);
  }
  if (!l.activations.empty()) j["activations"] = terms_json(l.activations);
  if (l.weight_reads) j["weight_reads"] = terms_json(*l.weight_reads);
  if (!l.weight_work.empty()) j["weight_work"] = terms_json(l.weight_work);
  return j;
}

}  // namespace

std::string to_json(const ModelDescription& m, const std::string& comment) {
  ojson j = {{"name", m.name}};
  if (!comment.empty()) j["comment"] = comment;
  if (!m.kernels.empty()) j["kernels"] = m.kernels;
  j["sequence_length"] = m.sequence_length;
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  if (m.kv_heads != m.heads) j["kv_heads"] = m.kv_heads;
  j["blocks"] = m.blocks;
  j["activation_dtype"] = dtype_name(m.activation_dtype);
  j["embedding"] = layer_json(m.embedding);
  j["block"] = layer_json(m.block);
  j["head"] = layer_json(m.head);
  return j.dump(1) + "\n";
}

namespace {

// Whether a head tensor is tied to the embedding tensor `name`.
bool head_ties(const ModelDescription& m, const std::string& name) {
  return std::any_of(m.head.tensors.begin(), m.head.tensors.end(),
                     [&](const DescribedTensor& h) { return h.tied_to == name; });
}

// One tp rank's shape of `t` (the vocabulary padded first).
std::vector<int64_t> rank_shape(const DescribedTensor& t, int tp) {
  if (tp == 1) return t.shape;
  std::vector<int64_t> shape = t.shape;
  if (t.vocab) shape[0] = parallel::padded_vocab(shape[0], tp);
  return local_shape(t.name, shape, t.tp, tp);
}

// Why `t` cannot split over tp ("" when it can).
std::string indivisible(const DescribedTensor& t, int tp) {
  if (!t.tp.is_split() || t.vocab || tp == 1) return "";
  const int64_t n = t.shape[static_cast<size_t>(t.tp.dim)];
  if (n % (static_cast<int64_t>(t.tp.blocks) * tp) == 0) return "";
  return t.tp.blocks > 1 ? fmt::format("tp {} does not divide the {} blocks of dimension {} ({}) of {}", tp, t.tp.blocks,
                                       t.tp.dim, n, t.name)
                         : fmt::format("tp {} does not divide dimension {} ({}) of {}", tp, t.tp.dim, n, t.name);
}

// 2 x the elements of the layer's matrices on one tp rank: each pass's FLOPs per token by default.
double default_flops(const DescribedLayer& l, int tp) {
  double n = 0;
  for (const DescribedTensor& t : l.tensors) {
    if (t.shape.size() < 2) continue;
    double e = 1;
    for (int64_t d : rank_shape(t, tp)) e *= static_cast<double>(d);
    n += e;
  }
  return 2 * n;
}

// The bytes of `terms` for a micro-batch of `tokens` on one tp rank (`vocab`: the vocabulary's rows).
uint64_t term_bytes(const std::vector<ActivationTerm>& terms, uint64_t tokens, int tp, bool sequence_parallel,
                    int64_t vocab) {
  using Split = ActivationTerm::Split;
  uint64_t sum = 0;
  for (const ActivationTerm& t : terms) {
    if ((t.when == ActivationTerm::When::kTp1 && tp != 1) || (t.when == ActivationTerm::When::kAboveTp1 && tp == 1)) continue;
    double part = t.per == ActivationTerm::Per::kToken ? t.bytes * static_cast<double>(tokens) : t.bytes;
    if (t.split == Split::kTp || (t.split == Split::kSequence && sequence_parallel)) part /= tp;
    // A rank's rows of the padded vocabulary, of the whole's.
    if (t.split == Split::kVocab) {
      part = part * static_cast<double>(parallel::padded_vocab(vocab, tp)) / (static_cast<double>(vocab) * tp);
    }
    sum += static_cast<uint64_t>(std::llround(part));
  }
  return sum;
}

// The scopes of one micro-step as a training loop of this shape opens them (examples/gpt's does):
// the forward in order, the tied head in the embedding's unit after its own; the backward in
// reverse, the tied head's unit first, held open through the whole backward when this stage is also
// the first (the embedding's gradient completes there). An fp32 gradient is asked for once, when
// its layer's backward first needs it; bf16 ones as their unit's backward scope closes (where the
// loop mirrors them into the engine).
std::vector<plan::ScopeEvent> micro_step(const plan::ModelSpec& spec, int blocks, bool first, bool last, int begin,
                                         int end, const std::vector<bool>& head_uses) {
  using plan::ScopeEvent;
  std::vector<ScopeEvent> events;
  const int head = blocks + 1;
  const bool tied = std::find(head_uses.begin(), head_uses.end(), true) != head_uses.end();
  auto scope = [&](int unit) {
    events.push_back({ScopeEvent::kOpen, unit, false, 0});
    events.push_back({ScopeEvent::kClose, unit, false, 0});
  };
  if (first) scope(0);
  for (int b = begin; b < end; ++b) scope(b + 1);
  if (last) {
    scope(head);
    if (tied) scope(0);
  }
  std::vector<bool> asked(spec.tensors.size(), false);
  auto ask = [&](int unit, bool head_only = false) {
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      if (head_only && !head_uses[i]) continue;
      if (spec.tensors[i].unit == unit && spec.dtype_of(spec.tensors[i]) == DType::kFloat32 && !asked[i]) {
        asked[i] = true;
        events.push_back({ScopeEvent::kGrad, unit, true, i});
      }
    }
  };
  auto open = [&](int unit) { events.push_back({ScopeEvent::kOpen, unit, true, 0}); };
  auto close = [&](int unit) {
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      if (spec.tensors[i].unit == unit && spec.dtype_of(spec.tensors[i]) != DType::kFloat32) {
        events.push_back({ScopeEvent::kGrad, unit, true, i});
      }
    }
    events.push_back({ScopeEvent::kClose, unit, true, 0});
  };
  bool unit0_open = false;
  if (last) {
    if (tied) {
      open(0);
      ask(0, true);
      if (first) {
        unit0_open = true;
      } else {
        close(0);
      }
    }
    open(head);
    ask(head);
    close(head);
  }
  for (int b = end - 1; b >= begin; --b) {
    open(b + 1);
    ask(b + 1);
    close(b + 1);
  }
  if (first) {
    if (!unit0_open) open(0);
    ask(0);
    close(0);
  }
  return events;
}

}  // namespace

void two_optimizer_groups(EngineOptions& o, const std::string& source, const char* program) {
  std::vector<optim::Hyper>& groups = o.optimizer.groups;
  if (groups.size() == 1) {
    groups.push_back(groups[0]);
    groups[1].weight_decay = 0.0f;
  }
  if (groups.size() != 2) {
    ZERO_THROW(InvalidArgument, "{} has {} optimizer groups; {} uses two (decayed weights, then the rest)", source,
               groups.size(), program);
  }
}

DescribedModel::DescribedModel(ModelDescription description, DType dtype)
    : description_(std::move(description)), dtype_(dtype) {}

std::string DescribedModel::unsupported(const Layout& l, int global_batch) const {
  const ModelDescription& m = description_;
  if (m.heads % l.tp != 0) return fmt::format("tp {} does not divide the {} heads", l.tp, m.heads);
  if (m.kv_heads % l.tp != 0) return fmt::format("tp {} does not divide the {} key and value heads", l.tp, m.kv_heads);
  for (const DescribedLayer* layer : {&m.embedding, &m.block, &m.head}) {
    for (const DescribedTensor& t : layer->tensors) {
      if (const std::string why = indivisible(t, l.tp); !why.empty()) return why;
    }
  }
  if (l.sequence_parallel && m.sequence_length % l.tp != 0) {
    return fmt::format("sequence parallelism: tp {} does not divide the sequence length {}", l.tp, m.sequence_length);
  }
  if (l.virtual_stages() > m.blocks) {
    return l.chunks > 1 ? fmt::format("pp {} x {} chunks is more stages than the {} blocks", l.pp, l.chunks, m.blocks)
                        : fmt::format("pp {} is more stages than the {} blocks", l.pp, m.blocks);
  }
  if (l.schedule == "interleaved" && l.micro_batches % l.pp != 0) {
    return fmt::format("interleaved: {} micro-batches are not a multiple of pp {}", l.micro_batches, l.pp);
  }
  if (global_batch % (l.dp * l.micro_batches) != 0) {
    return fmt::format("the batch {} does not divide into dp {} x {} micro-batches", global_batch, l.dp, l.micro_batches);
  }
  return "";
}

std::shared_ptr<const plan::ModelSpec> DescribedModel::spec(int tp, bool sp, int stages, int s) const {
  const auto key = std::make_tuple(tp, sp, stages, s);
  {
    std::lock_guard<std::mutex> lock(specs_mutex_);
    if (auto it = specs_.find(key); it != specs_.end()) return it->second;
  }
  // Made outside the lock (two threads may make the same; the first kept).
  const auto [begin, end] = parallel::even_stage_range(description_.blocks, stages, s);
  auto made = std::make_shared<const plan::ModelSpec>(
      stage_model({.tp = tp, .sequence_parallel = sp, .first_block = begin, .end_block = end, .first = s == 0,
                   .last = s == stages - 1, .stages = stages}));
  std::lock_guard<std::mutex> lock(specs_mutex_);
  return specs_.emplace(key, std::move(made)).first->second;
}

plan::ModelSpec DescribedModel::stage_model(const StagePart& part) const {
  const ModelDescription& m = description_;
  const int tp = part.tp, begin = part.first_block, end = part.end_block, stages = part.stages;
  const bool sp = part.sequence_parallel, first = part.first, last = part.last;
  ZERO_CHECK(tp >= 1 && 0 <= begin && begin <= end && end <= m.blocks && stages >= 1,
             "stage_model: blocks [{}, {}) of {}, tp {}, {} stages", begin, end, m.blocks, tp, stages);
  plan::ModelSpec spec;
  spec.dtype = dtype_;
  auto add = [&](const DescribedTensor& t, const std::string& name, int unit, bool tied) {
    plan::TensorSpec out;
    out.name = name;
    out.shape = rank_shape(t, tp);
    out.unit = unit;
    out.group = t.no_decay ? 1 : 0;
    out.tp = tp > 1 && sp && !t.tp.is_split() ? TpPlacement::replicated_partial() : tp > 1 ? t.tp : TpPlacement();
    out.tied = tied;
    out.dtype = t.dtype;
    out.param_dtype = t.dtype;  // kept in its own dtype also where stage 3 gathers the rest narrower
    spec.tensors.push_back(std::move(out));
  };
  // A tied embedding tensor is held by the first and the last stage, each copy marked.
  if (first) {
    for (const DescribedTensor& t : m.embedding.tensors) add(t, t.name, 0, stages > 1 && head_ties(m, t.name));
  } else if (last) {
    // The tied copies first, in the embedding's place in the registration order.
    for (const DescribedTensor& e : m.embedding.tensors) {
      if (head_ties(m, e.name)) add(e, e.name, 0, true);
    }
  }
  for (int b = begin; b < end; ++b) {
    for (const DescribedTensor& t : m.block.tensors) add(t, fmt::format("blocks.{}.{}", b, t.name), b + 1, false);
  }
  if (last) {
    for (const DescribedTensor& t : m.head.tensors) {
      if (t.tied_to.empty()) add(t, t.name, m.blocks + 1, false);
    }
  }
  // The embedding tensors the head uses (its tied ones), as this stage holds them.
  std::vector<bool> head_uses(spec.tensors.size(), false);
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    head_uses[i] = last && spec.tensors[i].unit == 0 && head_ties(m, spec.tensors[i].name);
  }
  spec.schedule = micro_step(spec, m.blocks, first, last, begin, end, head_uses);
  return spec;
}

StageCosts DescribedModel::stage(const Layout& l, int s, int global_batch, const Cluster& cluster) const {
  const ModelDescription& m = description_;
  const int stages = l.virtual_stages();
  const bool first = s == 0, last = s == stages - 1, sp = l.sequence_parallel;
  const auto [begin, end] = parallel::even_stage_range(m.blocks, stages, s);
  const int blocks = end - begin;
  const int batch = global_batch / (l.dp * l.micro_batches);  // sequences per micro-batch
  const uint64_t tokens = static_cast<uint64_t>(batch) * m.sequence_length;
  const double rate = cluster.peak_flops * cluster.matmul_efficiency;
  const int64_t vocab = vocabulary(m);
  StageCosts out;
  out.engine = spec(l.tp, sp, stages, s);
  out.units = m.blocks + 2;

  struct Part {
    const DescribedLayer* layer;
    KernelLayer kind;
    int count;
  };
  int64_t rebuilding = 0, head_change = 0;  // recompute's input part: the blocks', the head's
  const Part parts[] = {{&m.embedding, KernelLayer::kEmbedding, first ? 1 : 0},
                        {&m.block, KernelLayer::kBlock, blocks},
                        {&m.head, KernelLayer::kHead, last ? 1 : 0}};
  const double act = static_cast<double>(dtype_size(m.activation_dtype));
  const double stream = act * static_cast<double>(tokens) * m.hidden;  // the residual stream, whole
  for (const auto& [layer, kind, count] : parts) {
    if (count == 0) continue;
    // The layer's calibrated kernels where the cluster has them; else by default a matrix costs 2
    // FLOPs per element and token a pass, and the embedding's are lookups.
    const double flops = layer == &m.embedding ? 0.0 : default_flops(*layer, l.tp);
    auto seconds = [&, layer = layer, kind = kind, count = count](KernelPass pass) {
      if (const std::optional<double> t = kernel_seconds(cluster, m.kernels, kind, pass, batch, l)) return count * *t;
      const std::optional<double>& given = pass == KernelPass::kForward ? layer->forward
                                           : pass == KernelPass::kInput ? layer->backward_input
                                                                        : layer->backward_weight;
      return count * static_cast<double>(tokens) * (given ? *given / l.tp : flops) / rate;
    };
    out.forward += seconds(KernelPass::kForward);
    out.backward_input += seconds(KernelPass::kInput);
    out.backward_weight += seconds(KernelPass::kWeight);
    if (layer == &m.block && l.recompute) out.backward_input += seconds(KernelPass::kForward);
    // A layer timed on a real tp group has its collectives in those times.
    if (l.tp > 1 && kernel_timing(cluster, m.kernels, kind, batch, l) == KernelTiming::kCompute) {
      for (int k = 0; k < count; ++k) {
        std::vector<TpCollective> f;
        add_region_collectives(layer->enter, layer->leave, sp, stream, f, out.tp_backward);
        for (double bytes : layer->all_reduces_per_token) f.push_back({TpCollective::kAllReduce, bytes * tokens});
        out.tp_forward.insert(out.tp_forward.end(), f.begin(), f.end());
        // Recompute runs the block's forward, collectives and all, again in the backward.
        if (layer == &m.block && l.recompute) out.tp_backward.insert(out.tp_backward.end(), f.begin(), f.end());
      }
    }
    const uint64_t held = term_bytes(layer->activations, tokens, l.tp, sp, vocab);
    const uint64_t kept = (layer->weight_reads ? term_bytes(*layer->weight_reads, tokens, l.tp, sp, vocab) : held) +
                          term_bytes(layer->weight_work, tokens, l.tp, sp, vocab);
    out.weight_bytes += count * kept;
    if (layer == &m.block && l.recompute) {
      // Each block keeps its input (the stream's rows this rank holds); one block rebuilt at a time
      // in a whole backward; an input part rebuilds each block in turn and trades its input for
      // what its weight part keeps, so it peaks at the last block's rebuild (after the head's).
      const auto input = static_cast<uint64_t>(std::llround(sp ? stream / l.tp : stream));
      out.activation_bytes += count * input;
      if (count > 0) {
        out.rebuilt_bytes = held;
        rebuilding = static_cast<int64_t>((count - 1) * (kept - input) + held);
      }
    } else {
      out.activation_bytes += count * held;
    }
    if (layer == &m.head && count > 0) head_change = static_cast<int64_t>(kept) - static_cast<int64_t>(held);
  }
  if (rebuilding > 0) out.input_peak_bytes = static_cast<uint64_t>(std::max<int64_t>(0, head_change + rebuilding));
  out.send_bytes = last ? 0.0 : sp ? stream / l.tp : stream;
  return out;
}

}  // namespace zero::strategy
