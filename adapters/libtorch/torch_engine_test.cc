// TorchEngine against LibTorch's own loop (torch::optim::AdamW on the full batch), on ranks as threads
// of this process, with a model that exercises what the adapter promises: a root parameter, a unit
// used twice (a head tied to the input projection), a frozen parameter, and a unit that reads its
// own parameter through a detached view after all of its gradients have accumulated (so at stage 3
// its backward scope must stay open until its input's gradient is done). Also the errors that name
// a parameter or a unit. The multi-process run of the example is //examples/libtorch:train_torch_test.
#include "adapters/libtorch/torch_doctest.h"

#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "adapters/libtorch/torch_engine.h"
#include "base/error.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::libtorch {
namespace {

constexpr int64_t kIn = 16, kD = 32, kBatch = 8;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t d)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc(register_module("fc", torch::nn::Linear(d, d))),
        frozen(register_module("frozen", torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false)))) {
    frozen->weight.set_requires_grad(false);
  }
  // The detached product reads fc.weight in backward after every trainable gradient of the block
  // has accumulated: only its input's gradient says the block's backward is over.
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = ln(x.matmul(fc->weight.detach().t()) * 0.5);
    return x + fc(torch::gelu(frozen(y)));
  }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc, frozen;
};
TORCH_MODULE(Block);

struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : in(register_module("in", torch::nn::Linear(kIn, kD))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(kD), Block(kD)))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kD})))) {
    pos = register_parameter("pos", torch::randn({kD}) * 0.1);
  }
  torch::nn::Linear in;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::Tensor pos;
};
TORCH_MODULE(Tiny);

// How the forward runs a unit: directly, or through the adapter.
using Run = std::function<torch::Tensor(const std::string& unit, const torch::Tensor& input,
                                        const std::function<torch::Tensor(const torch::Tensor&)>& fn)>;

torch::Tensor tiny_loss(Tiny& m, const torch::Tensor& x, const torch::Tensor& labels, const Run& run) {
  torch::Tensor h = run("in", x, [&](const torch::Tensor& v) { return m->in(v); });
  h = run("", h, [&](const torch::Tensor& v) { return v + m->pos; });
  for (size_t b = 0; b < m->blocks->size(); ++b) {
    BlockImpl* block = m->blocks[b]->as<BlockImpl>();
    h = run("blocks." + std::to_string(b), h, [&](const torch::Tensor& v) { return block->forward(v); });
  }
  h = run("ln_f", h, [&](const torch::Tensor& v) { return m->ln_f(v); });
  // The head is tied to the input projection: unit "in" again.
  torch::Tensor logits = run("in", h, [&](const torch::Tensor& v) { return v.matmul(m->in->weight); });
  return torch::nn::functional::cross_entropy(logits, labels);
}

struct Batch {
  torch::Tensor x, labels;
};

Batch batch_of(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto teacher_gen = at::make_generator<at::CPUGeneratorImpl>(7);
  torch::Tensor teacher = torch::randn({kIn, kIn}, teacher_gen);
  torch::Tensor x = torch::randn({kBatch, kIn}, gen);
  return {x, x.matmul(teacher).argmax(1)};
}

// The default generator is global: ranks (threads) take turns.
Tiny make_model(uint64_t seed) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  return Tiny();
}

constexpr float kLr = 1e-2f, kWd = 0.01f;
constexpr int kSteps = 8;

struct Trace {
  std::vector<double> losses;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

Trace reference() {
  Tiny m = make_model(1);
  std::vector<torch::Tensor> trainable;
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
  Trace t;
  const Run direct = [](const std::string&, const torch::Tensor& v, const auto& fn) { return fn(v); };
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch_of(s);
    opt.zero_grad();
    torch::Tensor loss = tiny_loss(m, b.x, b.labels, direct);
    loss.backward();
    opt.step();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& item : m->named_parameters()) t.params.emplace_back(item.key(), item.value().detach().clone());
  return t;
}

EngineOptions options_for(int stage, int micro_steps = 1) {
  EngineOptions o;
  o.stage = stage;
  o.micro_batches = micro_steps;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = kLr, .weight_decay = kWd}};
  // Small buckets: several per step below stage 3.
  o.layout.bucket_numel = 512;
  o.layout.block = 64;
  return o;
}

// One rank's loop on its share of every batch, in `micro` micro-steps; returns the global losses and
// final parameters.
// `wrapped` false: the model's forward runs without forward_unit (stages 0-2 allow it).
Trace engine_rank(comm::Communicator& comm, int stage, int micro = 1, bool wrapped = true) {
  const int rank = comm.rank(), world = comm.size();
  Tiny m = make_model(1 + 17 * static_cast<uint64_t>(rank));  // finalize() broadcasts rank 0's
  Engine engine(comm, options_for(stage, micro));
  TorchEngine zt(engine, *m, {.units = {"", "in", "blocks.0", "blocks.1", "ln_f"}});
  zt.finalize();
  if (stage == 3) {
    // The trainable parameters' own storage is released; the frozen ones stay.
    CHECK(m->in->weight.data_ptr() == nullptr);
    CHECK(m->blocks[0]->as<BlockImpl>()->frozen->weight.data_ptr() != nullptr);
  }
  const Run through = [&](const std::string& unit, const torch::Tensor& v, const auto& fn) {
    return wrapped ? zt.forward_unit(zt.unit(unit), v, fn) : fn(v);
  };
  Trace t;
  const int64_t local = kBatch / world / micro;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch_of(s);
    double l = 0;
    for (int k = 0; k < micro; ++k) {
      const int64_t first = (rank * micro + k) * local;
      torch::Tensor x = b.x.narrow(0, first, local), y = b.labels.narrow(0, first, local);
      torch::Tensor loss = tiny_loss(m, x, y, through);
      zt.backward(loss);
      for (const auto& p : m->parameters()) CHECK_FALSE(p.grad().defined());  // the engine holds the gradients
      l += loss.item<double>() / micro;
    }
    zt.step();
    comm.all_reduce(&l, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    t.losses.push_back(l);
  }
  t.params = zt.full_parameters();
  return t;
}

void compare(const Trace& got, const Trace& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    CAPTURE(s);
    CAPTURE(got.losses[s]);
    CAPTURE(want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-5 * std::abs(want.losses[s]));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    CAPTURE(want.params[i].first);
    CHECK(got.params[i].first == want.params[i].first);
    CHECK((got.params[i].second - want.params[i].second).abs().max().item<double>() <= 2e-4);
  }
}

TEST_CASE("TorchEngine follows torch::optim::AdamW on the full batch, stages 0-3, 1 and 2 ranks, 2 micro-steps, an unwrapped forward") {
  torch::set_num_threads(1);
  const Trace want = reference();
  CHECK(want.losses.back() < want.losses.front());
  for (int world : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(world);
      CAPTURE(stage);
      std::vector<Trace> got(static_cast<size_t>(world));
      testing::run_thread_ranks(world, [&](comm::Communicator& comm) {
        got[static_cast<size_t>(comm.rank())] = engine_rank(comm, stage);
      });
      compare(got[0], want);
    }
  }
  // Gradient accumulation: each micro-step's gradients go to where the engine says in that micro-step.
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    std::vector<Trace> got(2);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      got[static_cast<size_t>(comm.rank())] = engine_rank(comm, stage, /*micro=*/2);
    });
    compare(got[0], want);
  }
  // Below stage 3 the forward may stay as it is: each unit's backward scope opens at its first gradient.
  for (int stage : {0, 2}) {
    CAPTURE(stage);
    std::vector<Trace> got(2);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      got[static_cast<size_t>(comm.rank())] = engine_rank(comm, stage, /*micro=*/1, /*wrapped=*/false);
    });
    compare(got[0], want);
  }
}

TEST_CASE("TorchEngine: errors name the unit or the parameter") {
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    {
      Tiny m = make_model(1);
      Engine engine(comm, options_for(2));
      CHECK_THROWS_WITH_AS(TorchEngine(engine, *m, {.units = {"in", "blocks.7"}}),
                           doctest::Contains("'blocks.7' is neither a module path nor a parameter"), InvalidArgument);
      CHECK_THROWS_WITH_AS(TorchEngine(engine, *m, {.units = {"in", "blocks"}}),
                           doctest::Contains("parameter 'pos' belongs to none of the units"), InvalidArgument);
    }
    {
      Tiny m = make_model(1);
      m->ln_f->weight.set_data(m->ln_f->weight.to(torch::kDouble));
      Engine engine(comm, options_for(2));
      CHECK_THROWS_WITH_AS(TorchEngine(engine, *m), doctest::Contains("parameter 'ln_f.weight' is Double"),
                           InvalidArgument);
    }
    {
      Tiny m = make_model(1);
      EngineOptions o = options_for(3);
      o.param_dtype = DType::kBFloat16;
      Engine engine(comm, o);
      CHECK_THROWS_WITH_AS(TorchEngine(engine, *m), doctest::Contains("EngineOptions.param_dtype bf16 is not supported"),
                           InvalidArgument);
    }
    {
      Tiny m = make_model(1);
      Engine engine(comm, options_for(2));
      TorchEngine zt(engine, *m);  // default units: "", then the children "in", "blocks", "ln_f"
      CHECK(zt.num_units() == 4);
      CHECK(zt.unit_name(0).empty());
      CHECK(zt.unit("blocks") == 2);
      CHECK_THROWS_WITH_AS(zt.unit("head"), doctest::Contains("no unit 'head' (units: '', 'in', 'blocks', 'ln_f')"),
                           InvalidArgument);
      CHECK_THROWS_WITH_AS(zt.backward(torch::zeros({})), doctest::Contains("backward() before finalize()"),
                           InvalidArgument);
    }
  });
}

TEST_CASE("TorchEngine::forward runs a Sequential unit by unit; a child with parameters that is not a unit is refused") {
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    torch::manual_seed(3);
    torch::nn::Sequential seq(torch::nn::Linear(4, 8), torch::nn::GELU(), torch::nn::Linear(8, 2));
    torch::nn::Sequential plain(torch::nn::Linear(4, 8), torch::nn::GELU(), torch::nn::Linear(8, 2));
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < seq->parameters().size(); ++i) plain->parameters()[i].copy_(seq->parameters()[i]);
    }
    Engine engine(comm, options_for(3));
    TorchEngine zt(engine, *seq);
    zt.finalize();
    const torch::Tensor x = torch::randn({3, 4});
    CHECK(torch::allclose(zt.forward(seq, x), plain->forward(x)));

    // One unit for everything (""): the children are not units, so forward() cannot gather them.
    torch::nn::Sequential other(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
    Engine engine2(comm, options_for(1));
    TorchEngine zt2(engine2, *other, {.units = {""}});
    zt2.finalize();
    CHECK_THROWS_WITH_AS(zt2.forward(other, x),
                         doctest::Contains("child 0 ('0') of the Sequential holds parameters but is not a unit"),
                         InvalidArgument);
  });
}

// A bf16 projection beside an fp32 head, as a model converted to bf16 but for its last layer: the
// adapter registers each parameter in its own dtype.
struct MixedImpl : torch::nn::Module {
  MixedImpl() : in(register_module("in", torch::nn::Linear(kIn, kD))), head(register_module("head", torch::nn::Linear(kD, kIn))) {
    in->to(torch::kBFloat16);
  }
  torch::nn::Linear in, head;
};
TORCH_MODULE(Mixed);

// One rank's training of Mixed at `stage`: the losses and the final parameters.
Trace mixed_rank(comm::Communicator& comm, int stage) {
  Mixed m = [] {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    torch::manual_seed(5);
    return Mixed();
  }();
  EngineOptions o = options_for(stage);
  o.deterministic = true;
  o.grad_accum_dtype = DType::kBFloat16;  // bf16 gradients stay bf16 at every stage, fp32 ones fp32
  Engine engine(comm, o);
  TorchEngine zt(engine, *m);
  zt.finalize();
  Trace t;
  const int64_t local = kBatch / comm.size();
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch_of(s);
    torch::Tensor x = b.x.narrow(0, comm.rank() * local, local), y = b.labels.narrow(0, comm.rank() * local, local);
    torch::Tensor h = zt.forward_unit(zt.unit("in"), x, [&](const torch::Tensor& v) {
      return m->in(v.to(torch::kBFloat16)).to(torch::kFloat);
    });
    torch::Tensor logits = zt.forward_unit(zt.unit("head"), torch::gelu(h), [&](const torch::Tensor& v) { return m->head(v); });
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    zt.backward(loss);
    zt.step();
    double l = loss.item<double>();
    comm.all_reduce(&l, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    t.losses.push_back(l);
  }
  t.params = zt.full_parameters();
  return t;
}

TEST_CASE("TorchEngine: a bf16 module beside an fp32 one trains the same bits at stages 0-3") {
  torch::set_num_threads(1);
  std::vector<Trace> first(2);
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    std::vector<Trace> got(2);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) { got[static_cast<size_t>(comm.rank())] = mixed_rank(comm, stage); });
    REQUIRE(got[0].params.size() == 4);
    CHECK((got[0].params[0].second.scalar_type() == torch::kBFloat16));  // in.weight
    CHECK((got[0].params[2].second.scalar_type() == torch::kFloat));     // head.weight
    CHECK(got[0].losses.back() < got[0].losses.front());
    if (stage == 0) {
      first = got;
      continue;
    }
    CHECK(got[0].losses == first[0].losses);
    for (size_t i = 0; i < got[0].params.size(); ++i) {
      CAPTURE(got[0].params[i].first);
      CHECK(torch::equal(got[0].params[i].second, first[0].params[i].second));
    }
  }
}

}  // namespace
}  // namespace zero::libtorch
