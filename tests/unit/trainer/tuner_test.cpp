// The Tuner (trainer/tuner.h) on one process: the LR finder's suggestion against a measured grid
// of 1-epoch runs, the batch-size finder's searches against a module that runs out of memory
// above a size, and both undoing their steps bit for bit (through the API and the flags).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/trainer/trainer.h>
#include <lockstep/trainer/tuner.h>

#include "../../support/parity.h"
#include "../../support/temp_dir.h"
#include "../../support/trainer_runs.h"

namespace lockstep {
namespace tuner_test {

// 4 classes of 8 features, labelled by a fixed random teacher network: a task where too small a
// learning rate learns little in an epoch and too large a one diverges.
std::shared_ptr<TensorDataset> teacher_data(int64_t n, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, 8}, generator);
  auto teacher_generator = at::make_generator<at::CPUGeneratorImpl>(99);
  auto w1 = torch::randn({8, 32}, teacher_generator), w2 = torch::randn({32, 4}, teacher_generator);
  auto y = torch::tanh(x.mm(w1)).mm(w2).argmax(1);
  return std::make_shared<TensorDataset>(x, y);
}

// The tests' MLP (support/parity.h: 8 -> 32 -> 32 -> 4) as a classifier, SGD with momentum 0.9.
struct Classifier : TrainingModule {
  explicit Classifier(double lr) : lr(lr) {
    torch::manual_seed(5);  // every instance starts from the same weights
    net = register_module("net", testing::ParityMlp(32));
  }
  torch::Tensor training_step(Batch& batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(net(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(Batch& batch, int64_t) override {
    log("val_loss", torch::nn::functional::cross_entropy(net(batch.data), batch.target));
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
  }
  double lr;
  testing::ParityMlp net{nullptr};
};

TrainerOptions one_epoch(const testing::TempDir& dir) {
  return testing::quiet_options(dir).max_epochs(1).enable_model_summary(false).trainer_variables(false);
}

std::shared_ptr<DataLoader> train_loader(int64_t batch_size = 32) {
  return std::make_shared<DataLoader>(teacher_data(2048, 1), DataLoaderOptions(batch_size).shuffle(true).seed(3));
}

// The validation loss after one epoch at `lr`.
double one_epoch_loss(double lr) {
  testing::TempDir dir("tuner_grid");
  Trainer trainer(one_epoch(dir));
  auto model = std::make_shared<Classifier>(lr);
  trainer.fit(model, train_loader());
  auto val = std::make_shared<DataLoader>(teacher_data(512, 2), DataLoaderOptions(256));
  return trainer.validate(model, val).at("val_loss");
}

// The grid measured on 2026-12-06 (validation loss of 512 held-out examples after one epoch of 64
// steps, Adam, from the same weights), and the finder's suggestion (Lightning's defaults):
//   lr     1e-4  1.8e-4 3.2e-4 5.6e-4 1e-3  1.8e-3 3.2e-3 5.6e-3 1e-2  1.8e-2 3.2e-2 5.6e-2 0.1   0.18  0.32  0.56  1
//   loss   1.388 1.376  1.354  1.306  1.190 0.941  0.656  0.514  0.540 0.563  0.546  0.647  0.668 0.846 1.227 1.398 2.310
// Best 0.514 at 5.6e-3; within 15% of it (<= 0.591): 5.6e-3 to 3.2e-2. Suggested: 0.0363 (step 81),
// whose own epoch ends at 0.552. Lightning 2.6's slope against lr itself would suggest 1.2e-4 (step 50,
// noise among the tiny rates), where an epoch ends near 1.38.
TEST(TunerLRFinder, SuggestionLiesWhereOneEpochEndsLowest) {
  std::vector<double> grid, losses;
  for (int i = 0; i <= 16; ++i) grid.push_back(1e-4 * std::pow(10.0, i / 4.0));  // four a decade
  for (double lr : grid) losses.push_back(one_epoch_loss(lr));
  const double best = *std::min_element(losses.begin(), losses.end());
  double low = 1e9, high = 0;  // the grid's rates within 15% of the best loss
  for (size_t i = 0; i < grid.size(); ++i) {
    std::cout << "[ grid ] lr " << grid[i] << ": loss after one epoch " << losses[i] << "\n";
    if (losses[i] <= 1.15 * best) low = std::min(low, grid[i]), high = std::max(high, grid[i]);
  }
  testing::TempDir dir("tuner_lr");
  Trainer trainer(one_epoch(dir));
  auto model = std::make_shared<Classifier>(1e-3);
  const auto finder = Tuner(trainer).lr_find(model, train_loader());
  ASSERT_EQ(finder.lrs.size(), 100u) << "the loss never rose 4x its best: the range test runs its 100 steps";
  ASSERT_TRUE(finder.suggestion());
  const double suggested = *finder.suggestion();
  const double at_suggestion = one_epoch_loss(suggested);
  std::cout << "[ lr_find ] suggestion " << suggested << ": loss after one epoch " << at_suggestion << " (best of the "
            << "grid " << best << ", within 15% from " << low << " to " << high << ")\n";
  // Within the region to the grid's resolution, and inside it by its own epoch's loss.
  const double step = std::pow(10.0, 0.25);
  EXPECT_GE(suggested, low / step);
  EXPECT_LE(suggested, high * step);
  EXPECT_LE(at_suggestion, 1.15 * best);
  EXPECT_EQ(trainer.optimizers().front()->param_groups().front().options().get_lr(), suggested)
      << "update_lr sets the suggestion on the optimizer";
}

// The classifier, running out of memory on batches larger than `limit`: as c10::OutOfMemoryError
// (what LibTorch throws on CUDA), std::bad_alloc, or another error. Records the sizes it saw.
struct RunsOutAbove : Classifier {
  RunsOutAbove(int64_t limit, std::string how = "oom") : Classifier(1e-3), limit(limit), how(std::move(how)) {}
  torch::Tensor training_step(Batch& batch, int64_t i) override {
    if (i == 0 && (seen.empty() || seen.back() != batch.size())) seen.push_back(batch.size());
    if (batch.size() > limit) {
      if (how == "bad_alloc") throw std::bad_alloc();
      if (how == "other") throw std::runtime_error("a bug, not memory");
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB (a test's limit)");
    }
    return Classifier::training_step(batch, i);
  }
  int64_t limit;
  std::string how;
  std::vector<int64_t> seen;
};

// Searches a fresh module whose limit is `limit`; returns the size found and what it tried.
std::pair<int64_t, std::vector<int64_t>> search(int64_t limit, BatchSizeFinderOptions options, int64_t examples = 2048,
                                                const std::string& how = "oom") {
  testing::TempDir dir("tuner_bs");
  Trainer trainer(one_epoch(dir));
  auto model = std::make_shared<RunsOutAbove>(limit, how);
  auto train = std::make_shared<DataLoader>(teacher_data(examples, 1), DataLoaderOptions(16));
  const int64_t found = Tuner(trainer).scale_batch_size(model, train, options);
  EXPECT_EQ(train->options().batch_size(), found) << "the size found is set on the loader";
  return {found, model->seen};
}

TEST(TunerBatchSize, PowerDoublesUntilOutOfMemory) {
  const auto [found, tried] = search(37, BatchSizeFinderOptions());
  EXPECT_EQ(found, 32);
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(search(37, BatchSizeFinderOptions(), 2048, "bad_alloc").first, 32) << "std::bad_alloc counts as out of memory";
  EXPECT_EQ(search(37, BatchSizeFinderOptions().max_trials(3)).first, 8) << "three trials: 2, 4, 8";
  EXPECT_EQ(search(37, BatchSizeFinderOptions().init_val(5)).first, 20);
}

TEST(TunerBatchSize, BinsearchFindsTheBoundaryExactly) {
  const auto [found, tried] = search(37, BatchSizeFinderOptions().mode("binsearch").margin(0));
  EXPECT_EQ(found, 37);
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37}));
  // Lightning 2.6's margin: 5% below the boundary.
  EXPECT_EQ(search(37, BatchSizeFinderOptions().mode("binsearch")).first, 35);
  EXPECT_EQ(search(1000, BatchSizeFinderOptions().mode("binsearch").margin(0)).first, 1000);
}

TEST(TunerBatchSize, StopsAtTheDatasetsLength) {
  for (const char* mode : {"power", "binsearch"}) {
    const auto [found, tried] = search(1 << 20, BatchSizeFinderOptions().mode(mode).margin(0), 100);
    EXPECT_EQ(found, 100) << mode;
    EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 100})) << mode;
  }
}

TEST(TunerBatchSize, OtherErrorsAndNoRoomAtAllStopTheSearch) {
  EXPECT_THROW(search(37, BatchSizeFinderOptions(), 2048, "other"), std::runtime_error);
  try {
    search(0, BatchSizeFinderOptions().init_val(1));
    ADD_FAILURE() << "batch size 1 ran out of memory: no size fits";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 1 ran out of memory"), std::string::npos) << e.what();
  }
}

// Every parameter, optimizer state tensor and option, the counters and the generator.
struct Snapshot {
  explicit Snapshot(Trainer& trainer) {
    for (const auto& p : trainer.module()->parameters()) tensors.push_back(p.detach().clone());
    const auto state = checkpoint::optimizer_state_dict(*trainer.optimizers().front());
    for (const auto& entry : state.at("state").toGenericDict()) {
      for (const auto& value : entry.value().toGenericDict()) tensors.push_back(value.value().toTensor().clone());
    }
    lr = trainer.optimizers().front()->param_groups().front().options().get_lr();
    step = trainer.global_step();
    epoch = trainer.current_epoch();
    rng = at::detail::getDefaultCPUGenerator().get_state();
  }
  // What differs, or "".
  std::string difference(const Snapshot& o) const {
    if (tensors.size() != o.tensors.size()) return "the number of tensors";
    if (lr != o.lr || step != o.step || epoch != o.epoch) {
      return "lr " + std::to_string(lr) + "/" + std::to_string(o.lr) + ", step " + std::to_string(step) + "/" +
             std::to_string(o.step) + ", epoch " + std::to_string(epoch) + "/" + std::to_string(o.epoch);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!torch::equal(tensors[i], o.tensors[i])) return "tensor " + std::to_string(i);
    }
    return torch::equal(rng, o.rng) ? "" : "the generator";
  }
  std::vector<torch::Tensor> tensors;
  double lr = 0;
  int64_t step = 0, epoch = 0;
  torch::Tensor rng;
};

TEST(TunerRestore, BothSearchesLeaveWeightsOptimizerCountersAndGeneratorAsTheyWere) {
  testing::TempDir dir("tuner_restore");
  Trainer trainer(one_epoch(dir));
  auto model = std::make_shared<Classifier>(1e-2);
  auto train = train_loader();
  trainer.fit(model, train);  // Adam's moments and a step count to put back
  const Snapshot before(trainer);
  ASSERT_EQ(before.step, 64);
  Tuner tuner(trainer);
  const auto finder = tuner.lr_find(model, train, LRFinderOptions().update_lr(false));
  EXPECT_EQ(finder.lrs.size(), 100u);
  EXPECT_EQ(Snapshot(trainer).difference(before), "") << "lr_find changed the run";
  EXPECT_EQ(tuner.scale_batch_size(model, train, BatchSizeFinderOptions().max_trials(4)), 16);
  EXPECT_EQ(Snapshot(trainer).difference(before), "") << "scale_batch_size changed the run";
}

// --scale-batch-size and --lr-find, then fit: bit for bit the fit of a run given the size and the
// rate found, so the searches leave no trace but those two.
TEST(TunerFlags, FitAfterTheSearchesEqualsFitWithWhatTheyFound) {
  testing::TempDir dir("tuner_flags");
  Trainer tuned(one_epoch(dir).lr_find(true).scale_batch_size("binsearch").max_epochs(2));
  auto model = std::make_shared<RunsOutAbove>(300);
  auto train = train_loader(32);
  tuned.fit(model, train);
  const int64_t size = train->options().batch_size();
  const double lr = tuned.optimizers().front()->param_groups().front().options().get_lr();
  EXPECT_EQ(size, 285) << "the boundary, 300, less 5%";
  std::ifstream csv(std::filesystem::path(tuned.log_dir()) / "lr_find.csv");
  std::string line, suggested;
  int rows = 0;
  for (std::getline(csv, line); std::getline(csv, line); ++rows) {
    if (line.size() > 2 && line.substr(line.size() - 2) == ",1") suggested = line;
  }
  EXPECT_EQ(rows, 100);
  ASSERT_FALSE(suggested.empty()) << "the CSV marks the suggestion";
  EXPECT_EQ(std::stod(suggested.substr(suggested.find(',') + 1)), lr) << suggested;

  testing::TempDir plain_dir("tuner_plain");
  Trainer plain(one_epoch(plain_dir).max_epochs(2));
  auto same = std::make_shared<RunsOutAbove>(300);
  same->lr = lr;
  plain.fit(same, train_loader(size));
  EXPECT_EQ(plain.global_step(), tuned.global_step());
  const auto a = model->parameters(), b = same->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

TEST(TunerBadInput, EachIsOneMessageWithTheFix) {
  testing::TempDir dir("tuner_bad");
  const auto message_of_run = [&](const std::function<void()>& run) {
    try {
      run();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no UsageError");
  };
  auto model = std::make_shared<Classifier>(1e-3);
  EXPECT_NE(message_of_run([&] {
              Trainer trainer(one_epoch(dir));
              Tuner(trainer).lr_find(model, train_loader(), LRFinderOptions().min_lr(1).max_lr(0.1));
            }).find("0 < min_lr < max_lr"),
            std::string::npos);
  EXPECT_NE(message_of_run([&] {
              Trainer trainer(one_epoch(dir));
              Tuner(trainer).scale_batch_size(model, train_loader(), BatchSizeFinderOptions().mode("linear"));
            }).find("use power or binsearch"),
            std::string::npos);
  EXPECT_NE(message_of_run([&] {
              Trainer trainer(one_epoch(dir).scale_batch_size("double"));
              trainer.fit(model, train_loader());
            }).find("--scale-batch-size double: use power"),
            std::string::npos);
  EXPECT_NE(message_of_run([&] {
              Trainer trainer(one_epoch(dir).lr_find(true).ckpt_path("last"));
              trainer.fit(model, train_loader());
            }).find("Tune in the run's first fit, without --ckpt-path"),
            std::string::npos);
}

// Lightning's suggestion() on a made-up curve: the first 10 and the last point skipped, the
// non-finite losses left out without shifting the index, the slope against log10(lr).
TEST(TunerLRFinder, SuggestionIsTheSteepestDescentAfterTheSkippedPoints) {
  LRFinder finder;
  for (int i = 0; i < 20; ++i) {
    finder.lrs.push_back(std::pow(10.0, -4 + 0.2 * i));
    finder.losses.push_back(i < 3 ? 5.0 : 2.0 - (i >= 15 ? 0.5 : 0.0) - (i >= 16 ? 0.2 : 0.0));
  }
  finder.losses[12] = std::numeric_limits<double>::quiet_NaN();
  finder.losses[19] = -5;  // the last point: skipped
  // Central differences over 0.4 in log10(lr): -1.25 at 14, -1.75 at 15 (2.0 to 1.3), -0.5 at 16.
  ASSERT_TRUE(finder.suggestion_index());
  EXPECT_EQ(*finder.suggestion_index(), 15u);
  EXPECT_EQ(*finder.suggestion(), finder.lrs[15]);
  EXPECT_EQ(*finder.suggestion_index(0, 1), 2u) << "unskipped, the fall from 5.0 to 2.0 (-7.5 at 2 and 3) is steeper";
  EXPECT_FALSE(finder.suggestion(19, 1)) << "no two points left";
}

}  // namespace tuner_test
}  // namespace lockstep
