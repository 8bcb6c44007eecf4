#include <lockstep/distributed/ddp/sync_batchnorm.h>

#include <mutex>
#include <numeric>
#include <tuple>

#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <lockstep/distributed/ddp/ddp.h>

#include "../../../support/parity.h"
#include "../../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace sync_batchnorm_test {
namespace {

using lockstep::testing::clone_all;
using lockstep::testing::copy_into;
using lockstep::testing::max_difference;
using lockstep::testing::parameters_close;
using lockstep::testing::run_ranks;

constexpr double kTolerance = 1e-6;
constexpr int kSteps = 5;

enum class Kind { bn1d, bn2d };

torch::nn::Sequential make_model(Kind kind) {
  if (kind == Kind::bn1d) {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                                 torch::nn::Linear(16, 4));
  }
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
                               torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(4).momentum(0.3)),
                               torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 5 * 5, 4));
}

at::Tensor make_input(Kind kind, int64_t rows, at::Generator& gen) {
  // Offset and scale so that mean and variance are far from 0 and 1.
  if (kind == Kind::bn1d) return at::randn({rows, 8}, gen) * 3 + 2;
  return at::randn({rows, 3, 5, 5}, gen) * 2 - 1;
}

std::vector<at::Tensor> buffers_of(const torch::nn::Module& m) { return clone_all(m.buffers()); }

std::vector<at::Tensor> grads_of(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().detach().clone());
  return out;
}

std::vector<std::string> names_of(const std::vector<torch::OrderedDict<std::string, at::Tensor>::Item>& items) {
  std::vector<std::string> out;
  for (const auto& i : items) out.push_back(i.key());
  return out;
}

// What one process with plain BatchNorm on the whole batch computes at each step.
struct Reference {
  std::vector<at::Tensor> outputs;                   // per step, the whole batch
  std::vector<std::vector<at::Tensor>> grads, stats;  // per step, after backward / after the step
  std::vector<at::Tensor> params;                     // after all steps
};

struct Data {
  std::vector<at::Tensor> inputs, targets;  // per step, all ranks' rows
  std::vector<int64_t> offsets;             // first row of each rank
  std::vector<int64_t> rows;
};

Data make_data(Kind kind, const std::vector<int64_t>& rows) {
  Data d;
  d.rows = rows;
  int64_t total = 0;
  for (int64_t r : rows) {
    d.offsets.push_back(total);
    total += r;
  }
  auto gen = at::detail::createCPUGenerator(99);
  for (int s = 0; s < kSteps; ++s) {
    d.inputs.push_back(make_input(kind, total, gen));
    d.targets.push_back(at::randn({total, 4}, gen));
  }
  return d;
}

// The loss of DDP over ranks: the mean over ranks of each rank's mean squared error.
at::Tensor ranks_loss(const at::Tensor& out, const at::Tensor& target, const Data& d) {
  at::Tensor loss = torch::zeros({});
  for (size_t r = 0; r < d.rows.size(); ++r) {
    loss = loss + torch::mse_loss(out.narrow(0, d.offsets[r], d.rows[r]), target.narrow(0, d.offsets[r], d.rows[r]));
  }
  return loss / static_cast<double>(d.rows.size());
}

// Made once, in the test thread: the global generator is not for concurrent ranks.
std::vector<at::Tensor> initial_parameters(Kind kind) { return clone_all(make_model(kind)->parameters()); }

Reference train_reference(Kind kind, const Data& d, const std::vector<at::Tensor>& init) {
  auto model = make_model(kind);
  copy_into(model->parameters(), init);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Reference ref;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto out = model->forward(d.inputs[s]);
    ref.outputs.push_back(out.detach().clone());
    ranks_loss(out, d.targets[s], d).backward();
    ref.grads.push_back(grads_of(*model));
    opt.step();
    ref.stats.push_back(buffers_of(*model));
  }
  ref.params = clone_all(model->parameters());
  return ref;
}

struct Worst {
  std::mutex mutex;
  double outputs = 0, grads = 0, stats = 0, params = 0;
};

using ParityParam = std::tuple<int, Kind, bool>;  // world, model, uneven batches
class SyncBatchNormParity : public ::testing::TestWithParam<ParityParam> {};

TEST_P(SyncBatchNormParity, MatchesBatchNormOnTheWholeBatch) {
  torch::set_num_threads(1);
  const int world = std::get<0>(GetParam());
  const Kind kind = std::get<1>(GetParam());
  const bool uneven = std::get<2>(GetParam());
  std::vector<int64_t> rows(world, 4);
  if (uneven) rows = world == 2 ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{3, 5, 2, 6};
  const Data d = make_data(kind, rows);
  torch::manual_seed(21);
  const auto init = initial_parameters(kind);
  const Reference ref = train_reference(kind, d, init);
  Worst worst;
  run_ranks(world, [&](ProcessGroup& g) {
    auto model = make_model(kind);
    copy_into(model->parameters(), init);
    auto converted = convert_sync_batchnorm(model.ptr(), g);
    ASSERT_EQ(converted, model.ptr());
    ASSERT_NE(model[1]->as<SyncBatchNormImpl>(), nullptr);
    DistributedDataParallel ddp(model, g);
    const auto names = lockstep::testing::parameter_names(*model);
    const auto buffer_names = names_of(model->named_buffers().items());
    torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const int r = g.rank();
    double w_out = 0, w_grad = 0, w_stats = 0, w_params = 0;
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      auto x = d.inputs[s].narrow(0, d.offsets[r], rows[r]);
      auto out = ddp.forward(x);
      auto expected_out = ref.outputs[s].narrow(0, d.offsets[r], rows[r]);
      const auto diff = max_difference(out, expected_out);
      w_out = std::max(w_out, diff.max_abs);
      EXPECT_LE(diff.max_abs, kTolerance) << "step " << s << " rank " << r << " output[" << diff.index
                                          << "]: " << diff.actual << " vs " << diff.expected;
      torch::mse_loss(out, d.targets[s].narrow(0, d.offsets[r], rows[r])).backward();
      double w = 0;
      EXPECT_TRUE(parameters_close(grads_of(*model), ref.grads[s], kTolerance, names, &w)) << "grads, step " << s << " rank " << r;
      w_grad = std::max(w_grad, w);
      opt.step();
      EXPECT_TRUE(parameters_close(buffers_of(*model), ref.stats[s], kTolerance, buffer_names, &w)) << "buffers, step " << s << " rank " << r;
      w_stats = std::max(w_stats, w);
    }
    EXPECT_TRUE(parameters_close(model->parameters(), ref.params, kTolerance, names, &w_params)) << "rank " << r;
    std::lock_guard<std::mutex> lock(worst.mutex);
    worst.outputs = std::max(worst.outputs, w_out);
    worst.grads = std::max(worst.grads, w_grad);
    worst.stats = std::max(worst.stats, w_stats);
    worst.params = std::max(worst.params, w_params);
  });
  std::cout << "[ sync_bn ] world " << world << (kind == Kind::bn1d ? " BatchNorm1d" : " BatchNorm2d") << " rows";
  for (auto n : rows) std::cout << ' ' << n;
  std::cout << ": max |diff| outputs " << worst.outputs << ", grads " << worst.grads << ", running stats "
            << worst.stats << ", params after " << kSteps << " SGD steps " << worst.params << "\n";
}

std::string parity_name(const ::testing::TestParamInfo<ParityParam>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) +
         (std::get<1>(info.param) == Kind::bn1d ? "_bn1d" : "_bn2d") + (std::get<2>(info.param) ? "_uneven" : "_even");
}

INSTANTIATE_TEST_SUITE_P(WorldModelBatches, SyncBatchNormParity,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(Kind::bn1d, Kind::bn2d),
                                            ::testing::Bool()),
                         parity_name);

// ---- Conversion -------------------------------------------------------------------------------

struct ZooImpl : torch::nn::Module {
  ZooImpl()
      : seq(register_module("seq", torch::nn::Sequential(torch::nn::Linear(4, 5), torch::nn::BatchNorm1d(5)))),
        list(register_module("list", torch::nn::ModuleList(torch::nn::BatchNorm2d(3)))),
        dict(register_module("dict", torch::nn::ModuleDict(
                                         torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>(
                                             {{"bn3", torch::nn::BatchNorm3d(2).ptr()}})))),
        plain(register_module("plain", torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(7).affine(false)))) {}
  torch::nn::Sequential seq;
  torch::nn::ModuleList list;
  torch::nn::ModuleDict dict;
  torch::nn::BatchNorm1d plain;
};
TORCH_MODULE(Zoo);

TEST(SyncBatchNorm, ConvertKeepsNamesValuesAndTensors) {
  run_ranks(1, [](ProcessGroup& g) {
    Zoo zoo;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : zoo->parameters()) p.uniform_();
      for (auto& b : zoo->buffers()) {
        if (b.is_floating_point()) b.uniform_(1, 2);
      }
    }
    const auto params_before = zoo->named_parameters();
    const auto buffers_before = zoo->named_buffers();
    auto converted = convert_sync_batchnorm(zoo.ptr(), g);
    EXPECT_EQ(converted, zoo.ptr());
    const auto params_after = zoo->named_parameters();
    const auto buffers_after = zoo->named_buffers();
    EXPECT_EQ(names_of(params_after.items()), names_of(params_before.items()));
    EXPECT_EQ(names_of(buffers_after.items()), names_of(buffers_before.items()));
    for (const auto& item : params_before) {
      EXPECT_TRUE(params_after[item.key()].is_same(item.value())) << item.key();
    }
    for (const auto& item : buffers_before) EXPECT_TRUE(buffers_after[item.key()].equal(item.value())) << item.key();
    // In the tree and in the containers' own lists.
    for (const char* name : {"seq.1", "list.0", "dict.bn3", "plain"}) {
      auto m = zoo->named_modules()[name];
      EXPECT_NE(dynamic_cast<SyncBatchNormImpl*>(m.get()), nullptr) << name;
    }
    EXPECT_NE(zoo->seq->ptr(1)->as<SyncBatchNormImpl>(), nullptr);
    EXPECT_NE((*zoo->list)[0]->as<SyncBatchNormImpl>(), nullptr);
    EXPECT_NE(zoo->dict["bn3"]->as<SyncBatchNormImpl>(), nullptr);
    EXPECT_FALSE(zoo->named_modules()["plain"]->as<SyncBatchNormImpl>()->options.affine());
    // Sequential's forward goes through the SyncBatchNorm.
    auto sync = zoo->seq->ptr(1)->as<SyncBatchNormImpl>();
    const auto before = sync->num_batches_tracked.item<int64_t>();
    zoo->seq->forward(torch::randn({3, 4}));
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), before + 1);
    // A BatchNorm at the root is returned converted.
    auto root = convert_sync_batchnorm(torch::nn::BatchNorm2d(3).ptr(), g);
    EXPECT_NE(dynamic_cast<SyncBatchNormImpl*>(root.get()), nullptr);
  });
}

TEST(SyncBatchNorm, EvalModeIsPlainBatchNormWithRunningStatistics) {
  torch::set_num_threads(1);
  torch::manual_seed(5);
  torch::nn::BatchNorm2d plain(3);
  {
    torch::NoGradGuard no_grad;
    plain->running_mean.uniform_(-1, 1);
    plain->running_var.uniform_(0.5, 2);
    plain->weight.uniform_();
  }
  plain->eval();
  const auto x = torch::randn({2, 3, 4, 4});
  const auto expected = plain->forward(x);
  run_ranks(2, [&](ProcessGroup& g) {
    auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(plain->clone());
    auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(convert_sync_batchnorm(copy, g));
    ASSERT_TRUE(sync);
    EXPECT_FALSE(sync->is_training());
    // Rank 1 sees other data: in eval mode nothing is exchanged, each rank normalises its own.
    auto out = sync->forward(g.rank() == 0 ? x : x * 2);
    if (g.rank() == 0) EXPECT_LE(max_difference(out, expected).max_abs, 0.0);
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 0);
  });
}

// A typed member keeps pointing to the old BatchNorm: DDP says so instead of training it silently
// unsynchronised.
struct TypedImpl : torch::nn::Module {
  TypedImpl() : fc(register_module("fc", torch::nn::Linear(4, 3))), bn(register_module("bn", torch::nn::BatchNorm1d(3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(Typed);

TEST(SyncBatchNorm, ATypedMemberThatBypassesTheConversionIsAnError) {
  torch::set_num_threads(1);
  std::mutex mutex;
  std::vector<std::string> errors;
  run_ranks(2, [&](ProcessGroup& g) {
    Typed model;
    convert_sync_batchnorm(model.ptr(), g);
    DistributedDataParallel ddp(model, g);
    try {
      ddp.forward(torch::randn({4, 4}));
      ADD_FAILURE() << "rank " << g.rank() << ": no error";
    } catch (const UsageError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("BatchNorm 'bn'"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("Declare that member as lockstep::distributed::SyncBatchNorm"), std::string::npos) << errors[0];
}

// Found right after the conversion (what --sync-batchnorm checks at setup): the typed member
// still holds the replaced BatchNorm; a Sequential's BatchNorm is replaced everywhere.
TEST(SyncBatchNorm, BatchNormsHeldByTypedMembersAreFoundAtConversion) {
  run_ranks(1, [](ProcessGroup& g) {
    Typed typed;
    convert_sync_batchnorm(typed.ptr(), g);
    EXPECT_EQ(detail::replaced_batchnorms_still_held(*typed), std::vector<std::string>{"bn"});
    auto seq = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
    convert_sync_batchnorm(seq.ptr(), g);
    EXPECT_TRUE(detail::replaced_batchnorms_still_held(*seq).empty());
  });
}

TEST(SyncBatchNorm, MomentumNoneIsACumulativeAverageAsInBatchNorm) {
  torch::set_num_threads(1);
  torch::manual_seed(8);
  std::vector<at::Tensor> xs;
  for (int s = 0; s < 3; ++s) xs.push_back(torch::randn({6, 3}) + s);
  torch::nn::BatchNorm1d plain(torch::nn::BatchNorm1dOptions(3).momentum(c10::nullopt));
  for (const auto& x : xs) plain->forward(x);
  run_ranks(2, [&](ProcessGroup& g) {
    SyncBatchNorm sync(torch::nn::BatchNormOptions(3).momentum(c10::nullopt), &g);
    for (const auto& x : xs) sync->forward(x.narrow(0, 3 * g.rank(), 3));
    EXPECT_LE(max_difference(sync->running_mean, plain->running_mean).max_abs, kTolerance);
    EXPECT_LE(max_difference(sync->running_var, plain->running_var).max_abs, kTolerance);
  });
}

}  // namespace
}  // namespace sync_batchnorm_test
}  // namespace distributed
}  // namespace lockstep
