#include <lockstep/callbacks/model_checkpoint.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/core/error.h>
#include <lockstep/distributed/rank_zero.h>
#include <lockstep/strategies/strategy.h>
#include <lockstep/trainer/trainer.h>

#include "../../support/regression.h"
#include "../../support/time_saves.h"

namespace lockstep {
namespace model_checkpoint_test {
namespace {

namespace fs = std::filesystem;
using testing::regression_data;

/// Logs `val_score` = values[epoch] in validation, so that the ranking is scripted.
struct ScriptedScore : testing::Regressor {
  explicit ScriptedScore(std::vector<double> values) : values(std::move(values)) {}
  void validation_step(Batch& batch, int64_t) override { log("val_score", values.at(current_epoch())); }
  std::vector<double> values;
};

/// One rank of a 2-rank job, in this process: rank 0 records what it broadcasts, and rank 1,
/// run afterwards, receives the same values in the same order, as a process group would give.
struct ReplayedRankStrategy : strategies::SingleDeviceStrategy {
  ReplayedRankStrategy(int rank, std::shared_ptr<std::vector<c10::IValue>> channel)
      : rank(rank), channel(std::move(channel)) {}
  std::string name() const override { return "replayed_rank"; }
  int world_size() const override { return 2; }
  int global_rank() const override { return rank; }
  c10::IValue broadcast(const c10::IValue& value, int src) override {
    if (rank == src) {
      channel->push_back(value);
      return value;
    }
    return channel->at(received++);
  }
  void barrier(const std::string& name) override { barriers.push_back(name); }

  int rank;
  std::shared_ptr<std::vector<c10::IValue>> channel;
  size_t received = 0;
  std::vector<std::string> barriers;
};

class ModelCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    root = fs::temp_directory_path() / ("model_checkpoint_test_" + std::to_string(::getpid()));
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }

  TrainerOptions options(int64_t epochs) const {
    return TrainerOptions().max_epochs(epochs).enable_progress_bar(false).num_sanity_val_steps(0).default_root_dir(
        root.string());
  }
  // 2 training batches per epoch (global_step = 2 per epoch), 1 validation batch.
  void fit(Trainer& trainer, std::shared_ptr<TrainingModule> model, bool with_val = true) {
    trainer.fit(model, std::make_shared<DataLoader>(regression_data(32), DataLoaderOptions(16)),
                with_val ? std::make_shared<DataLoader>(regression_data(16, 8, 9), DataLoaderOptions(16)) : nullptr);
  }
  std::set<std::string> files(const fs::path& dir) const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
    return names;
  }
  std::string in_dir(const std::string& name) const { return (root / "ckpts" / name).string(); }

  fs::path root;
};

TEST_F(ModelCheckpointTest, KeepsTheTopKByMonitorAndDeletesTheRest) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                          .dirpath((root / "ckpts").string())
                                                          .filename("{epoch}-{val_score:.2f}")
                                                          .monitor("val_score")
                                                          .save_top_k(2));
  Trainer trainer(options(5));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.5, 0.3, 0.4, 0.2, 0.6}));

  // 0.5 in; 0.3 in; 0.4 replaces 0.5; 0.2 replaces 0.4; 0.6 is worse than both.
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=1-val_score=0.30.ckpt", "epoch=3-val_score=0.20.ckpt"}));
  EXPECT_EQ(checkpoint->best_model_path(), in_dir("epoch=3-val_score=0.20.ckpt"));
  ASSERT_TRUE(checkpoint->best_model_score().has_value());
  EXPECT_DOUBLE_EQ(*checkpoint->best_model_score(), 0.2);
  EXPECT_EQ(checkpoint->kth_best_model_path(), in_dir("epoch=1-val_score=0.30.ckpt"));
  ASSERT_EQ(checkpoint->best_k_models().size(), 2u);
  EXPECT_EQ(checkpoint->best_k_models()[0].first, in_dir("epoch=1-val_score=0.30.ckpt"));
  EXPECT_DOUBLE_EQ(checkpoint->best_k_models()[1].second, 0.2);

  // The best file holds the weights and the callback's state as of the epoch it was written.
  auto best = checkpoint::CheckpointIO().load(checkpoint->best_model_path());
  EXPECT_EQ(best.at("epoch").toInt(), 3);
  EXPECT_EQ(best.at("global_step").toInt(), 8);
  auto state = best.at("callbacks").toGenericDict().at(checkpoint->name()).toGenericDict();
  EXPECT_EQ(state.at("best_model_path").toStringRef(), checkpoint->best_model_path());
  EXPECT_DOUBLE_EQ(state.at("best_model_score").toDouble(), 0.2);
  EXPECT_EQ(state.at("best_k_models").toGenericDict().size(), 2u);
}

TEST_F(ModelCheckpointTest, MaxModeKeepsAllWithTopKMinusOne) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                          .dirpath((root / "ckpts").string())
                                                          .monitor("val_score")
                                                          .mode("max")
                                                          .save_top_k(-1));
  Trainer trainer(options(3));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.7, 0.9, 0.8}));
  EXPECT_EQ(files(root / "ckpts"),
            (std::set<std::string>{"epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"}));
  EXPECT_EQ(checkpoint->best_model_path(), in_dir("epoch=1-step=4.ckpt"));
  EXPECT_DOUBLE_EQ(*checkpoint->best_model_score(), 0.9);
}

TEST_F(ModelCheckpointTest, WithoutMonitorKeepsTheLatestInTheLogDir) {
  auto checkpoint = std::make_shared<ModelCheckpoint>();
  Trainer trainer(options(3));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<testing::Regressor>(), false);
  const fs::path dir = fs::path(trainer.log_dir()) / "checkpoints";
  EXPECT_EQ(checkpoint->dirpath(), dir.string());
  EXPECT_EQ(files(dir), (std::set<std::string>{"epoch=2-step=6.ckpt"}));
  EXPECT_EQ(checkpoint->best_model_path(), (dir / "epoch=2-step=6.ckpt").string());
  EXPECT_FALSE(checkpoint->best_model_score().has_value());
}

// A resumed run saves into its own version_N folder and leaves the first run's files alone.
TEST_F(ModelCheckpointTest, ResumingInANewLogDirKeepsThePreviousRunsCheckpoints) {
  Trainer first(options(2));
  auto first_checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().save_last(true));
  first.add_callback(first_checkpoint);
  fit(first, std::make_shared<testing::Regressor>(), false);
  const fs::path first_dir = fs::path(first.log_dir()) / "checkpoints";
  const std::set<std::string> first_files{"epoch=1-step=4.ckpt", "last.ckpt"};
  ASSERT_EQ(files(first_dir), first_files);

  Trainer again(options(3).ckpt_path((first_dir / "last.ckpt").string()));
  auto resumed = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().save_last(true));
  again.add_callback(resumed);
  fit(again, std::make_shared<testing::Regressor>(), false);
  ASSERT_NE(again.log_dir(), first.log_dir());
  EXPECT_EQ(files(first_dir), first_files);
  EXPECT_EQ(files(fs::path(again.log_dir()) / "checkpoints"),
            (std::set<std::string>{"epoch=2-step=6.ckpt", "last.ckpt"}));
}

TEST_F(ModelCheckpointTest, SaveLastWritesLastCkptEveryEpoch) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                          .dirpath((root / "ckpts").string())
                                                          .monitor("val_score")
                                                          .save_last(true));
  Trainer trainer(options(3));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.3, 0.1, 0.2}));
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=1-step=4.ckpt", "last.ckpt"}));
  EXPECT_EQ(checkpoint->last_model_path(), in_dir("last.ckpt"));
  auto last = checkpoint::CheckpointIO().load(in_dir("last.ckpt"));
  EXPECT_EQ(last.at("epoch").toInt(), 2);
  EXPECT_EQ(last.at("global_step").toInt(), 6);
  EXPECT_EQ(last.at("loops").toGenericDict().at("next_epoch").toInt(), 3);

  // save_top_k 0: only last.ckpt.
  auto only_last = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "last_only").string()).save_top_k(0).save_last(true));
  Trainer second(options(2));
  second.add_callback(only_last);
  fit(second, std::make_shared<testing::Regressor>());
  EXPECT_EQ(files(root / "last_only"), (std::set<std::string>{"last.ckpt"}));
  EXPECT_EQ(only_last->best_model_path(), "");
}

// save_safetensors: each kept checkpoint has its weights beside it, and they go with it.
TEST_F(ModelCheckpointTest, SaveSafetensorsWritesTheWeightsBesideEachCheckpointKept) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                          .dirpath((root / "ckpts").string())
                                                          .monitor("val_score")
                                                          .save_top_k(2)
                                                          .save_last(true)
                                                          .save_safetensors(true));
  Trainer trainer(options(4));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.5, 0.3, 0.4, 0.6}));
  EXPECT_EQ(files(root / "ckpts"),
            (std::set<std::string>{"epoch=1-step=4.ckpt", "epoch=1-step=4.safetensors", "epoch=2-step=6.ckpt",
                                   "epoch=2-step=6.safetensors", "last.ckpt", "last.safetensors"}));
  for (const std::string name : {"epoch=1-step=4", "last"}) {
    const auto saved = checkpoint::CheckpointIO().load(in_dir(name + ".ckpt")).at("state_dict").toGenericDict();
    const auto weights = checkpoint::load_safetensors(in_dir(name + ".safetensors")).tensors;
    ASSERT_EQ(weights.size(), saved.size()) << name;
    for (const auto& item : saved) {
      EXPECT_TRUE(torch::equal(weights.at(item.key().toStringRef()), item.value().toTensor())) << name << " " << item.key();
    }
  }
}

TEST_F(ModelCheckpointTest, EveryNTrainStepsSavesMidEpoch) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).every_n_train_steps(3).save_top_k(-1));
  Trainer trainer(options(3));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<testing::Regressor>());
  // Steps 3 (epoch 1, first batch) and 6 (epoch 2's end); epoch ends alone do not save.
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=1-step=3.ckpt", "epoch=2-step=6.ckpt"}));
  EXPECT_EQ(checkpoint::CheckpointIO().load(in_dir("epoch=1-step=3.ckpt")).at("global_step").toInt(), 3);
}

/// Logs `val_score` = values[global_step - 1]: one score per validation when validating after
/// every training batch.
struct ScorePerStep : testing::Regressor {
  explicit ScorePerStep(std::vector<double> values) : values(std::move(values)) {}
  void validation_step(Batch& batch, int64_t) override { log("val_score", values.at(global_step() - 1)); }
  std::vector<double> values;
};

// Validation within the epoch (val_check_interval below 1): as in Lightning, every validation
// saves, so the best score of the epoch is kept even when the epoch's last one is worse.
TEST_F(ModelCheckpointTest, ValidationWithinTheEpochSavesAfterEachValidation) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).monitor("val_score").save_top_k(2));
  Trainer trainer(options(2).val_check_interval(1));  // 2 batches an epoch: validates after each
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScorePerStep>(std::vector<double>{0.5, 0.9, 0.2, 0.8}));
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=0-step=1.ckpt", "epoch=1-step=3.ckpt"}));
  EXPECT_EQ(checkpoint->best_model_path(), in_dir("epoch=1-step=3.ckpt"));
  EXPECT_EQ(checkpoint::CheckpointIO().load(in_dir("epoch=0-step=1.ckpt")).at("global_step").toInt(), 1);
}

TEST_F(ModelCheckpointTest, ResumeRestoresTheTopKAndContinuesIt) {
  const std::vector<double> scores{0.5, 0.3, 0.4, 0.2, 0.6};
  auto make = [&] {
    return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                 .dirpath((root / "ckpts").string())
                                                 .monitor("val_score")
                                                 .save_top_k(2)
                                                 .save_last(true));
  };
  auto first = make();
  Trainer trainer(options(3));
  trainer.add_callback(first);
  fit(trainer, std::make_shared<ScriptedScore>(scores));
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt", "last.ckpt"}));

  auto resumed = make();
  Trainer again(options(5).ckpt_path(in_dir("last.ckpt")));
  again.add_callback(resumed);
  fit(again, std::make_shared<ScriptedScore>(scores));
  // Without the restored top k, epochs 3 and 4 would be the top 2 and epoch 2 would remain.
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt", "last.ckpt"}));
  EXPECT_EQ(resumed->best_model_path(), in_dir("epoch=3-step=8.ckpt"));
  EXPECT_DOUBLE_EQ(*resumed->best_model_score(), 0.2);
  EXPECT_EQ(resumed->kth_best_model_path(), in_dir("epoch=1-step=4.ckpt"));
}

TEST_F(ModelCheckpointTest, EveryRankFollowsRankZerosDecision) {
  auto channel = std::make_shared<std::vector<c10::IValue>>();
  auto run = [&](int rank, std::vector<double> scores) {
    auto strategy = std::make_shared<ReplayedRankStrategy>(rank, channel);
    auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                            .dirpath((root / "ckpts").string())
                                                            .monitor("val_score")
                                                            .save_last(true));
    Trainer trainer(options(3));
    trainer.set_strategy(strategy);
    trainer.add_callback(checkpoint);
    fit(trainer, std::make_shared<ScriptedScore>(std::move(scores)));
    distributed::set_global_rank(0);
    return std::make_pair(checkpoint, strategy);
  };
  auto [zero, zero_strategy] = run(0, {0.5, 0.3, 0.4});
  const auto written = files(root / "ckpts");
  EXPECT_EQ(written, (std::set<std::string>{"epoch=1-step=4.ckpt", "last.ckpt"}));
  const auto modified = fs::last_write_time(root / "ckpts" / "last.ckpt");
  // Rank 1's own values would make epoch 2 the best; it must keep rank 0's choice.
  auto [one, one_strategy] = run(1, {0.1, 0.9, 0.05});
  EXPECT_EQ(one_strategy->received, channel->size());
  EXPECT_EQ(one->best_model_path(), zero->best_model_path());
  EXPECT_EQ(one->best_model_path(), in_dir("epoch=1-step=4.ckpt"));
  EXPECT_DOUBLE_EQ(*one->best_model_score(), 0.3);
  EXPECT_EQ(one->last_model_path(), in_dir("last.ckpt"));
  EXPECT_EQ(one->best_k_models(), zero->best_k_models());
  // The same saves (each a barrier) on both ranks, and only rank 0 wrote or deleted files.
  EXPECT_EQ(one_strategy->barriers, zero_strategy->barriers);
  EXPECT_EQ(std::count(one_strategy->barriers.begin(), one_strategy->barriers.end(), "save_checkpoint"), 5);
  EXPECT_EQ(files(root / "ckpts"), written);
  EXPECT_EQ(fs::last_write_time(root / "ckpts" / "last.ckpt"), modified);
}

TEST_F(ModelCheckpointTest, StateDictRoundTrips) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).monitor("val_score").save_top_k(2));
  Trainer trainer(options(3));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.5, 0.3, 0.4}));
  ModelCheckpoint copy(ModelCheckpointOptions().monitor("val_score").save_top_k(2));
  copy.load_state_dict(checkpoint->state_dict());
  EXPECT_EQ(copy.best_model_path(), in_dir("epoch=1-step=4.ckpt"));
  EXPECT_DOUBLE_EQ(*copy.best_model_score(), 0.3);
  EXPECT_DOUBLE_EQ(*copy.current_score(), 0.4);
  ASSERT_EQ(copy.best_k_models().size(), 2u);
  EXPECT_EQ(copy.best_k_models()[1].first, in_dir("epoch=2-step=6.ckpt"));
  EXPECT_EQ(copy.kth_best_model_path(), in_dir("epoch=2-step=6.ckpt"));
}

TEST_F(ModelCheckpointTest, MissingMonitorListsTheLoggedMetrics) {
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).monitor("val_scor"));
  Trainer trainer(options(2));
  trainer.add_callback(checkpoint);
  try {
    fit(trainer, std::make_shared<ScriptedScore>(std::vector<double>{0.5, 0.3}));
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("ModelCheckpoint(monitor='val_scor') could not find the monitored key in the returned "
                            "metrics: ['epoch', 'step', ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("'val_score'"), std::string::npos) << message;
    EXPECT_NE(message.find("]. HINT: Did you call log('val_scor', value) in the TrainingModule?"), std::string::npos)
        << message;
  }
  EXPECT_FALSE(fs::exists(root / "ckpts"));

  // No validation at all: the first epoch end already shows the name is wrong.
  auto no_val = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions().monitor("val_loss"));
  Trainer second(options(2));
  second.add_callback(no_val);
  EXPECT_THROW(fit(second, std::make_shared<testing::Regressor>(), false), UsageError);
}

TEST_F(ModelCheckpointTest, FormatsNamesAsLightning) {
  ModelCheckpoint checkpoint(ModelCheckpointOptions().dirpath("/ck").filename("{epoch:03d}-{val_loss:.3f}-{acc}"));
  const std::map<std::string, double> metrics{{"epoch", 7}, {"step", 70}, {"val_loss", 0.12345}};
  EXPECT_EQ(checkpoint.format_checkpoint_name(metrics), "/ck/epoch=007-val_loss=0.123-acc=0.ckpt");
  EXPECT_EQ(checkpoint.format_checkpoint_name(metrics, "{val_loss}-{step}", 2), "/ck/val_loss=0.12345-step=70-v2.ckpt");
  EXPECT_EQ(checkpoint.format_checkpoint_name({{"loss", 100}, {"r", 1e-5}}, "{loss}_{r:.1e}_{r:.2%}"),
            "/ck/loss=100.0_r=1.0e-05_r=0.00%.ckpt");
  ModelCheckpoint plain(ModelCheckpointOptions().dirpath("/ck").filename("model-{epoch}").auto_insert_metric_name(false));
  EXPECT_EQ(plain.format_checkpoint_name(metrics), "/ck/model-7.ckpt");
  EXPECT_THROW(checkpoint.format_checkpoint_name(metrics, "{val_loss:>8}"), UsageError);
  EXPECT_THROW(checkpoint.format_checkpoint_name(metrics, "{val_loss"), UsageError);
}

TEST_F(ModelCheckpointTest, NeverOverwritesAnUnrelatedFile) {
  fs::create_directories(root / "ckpts");
  std::ofstream(root / "ckpts" / "epoch=0-step=2.ckpt") << "someone else's";
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).save_top_k(-1));
  Trainer trainer(options(1));
  trainer.add_callback(checkpoint);
  fit(trainer, std::make_shared<testing::Regressor>());
  EXPECT_EQ(files(root / "ckpts"), (std::set<std::string>{"epoch=0-step=2.ckpt", "epoch=0-step=2-v1.ckpt"}));
  EXPECT_EQ(fs::file_size(root / "ckpts" / "epoch=0-step=2.ckpt"), 14u);
  EXPECT_EQ(checkpoint->best_model_path(), in_dir("epoch=0-step=2-v1.ckpt"));
}

TEST_F(ModelCheckpointTest, InvalidSettingsAreUsageErrors) {
  auto expect_usage = [](const ModelCheckpointOptions& o, const std::string& needle) {
    try {
      ModelCheckpoint checkpoint(o);
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_usage(ModelCheckpointOptions().save_top_k(-2), "save_top_k=-2");
  expect_usage(ModelCheckpointOptions().mode("best"), "mode='best'");
  expect_usage(ModelCheckpointOptions().save_top_k(3), "Set monitor");
  expect_usage(ModelCheckpointOptions().every_n_epochs(2).every_n_train_steps(5), "mutually exclusive");
  expect_usage(ModelCheckpointOptions().every_n_train_steps(-1), ">= 0");
  // As Lightning's MisconfigurationException: one schedule a callback.
  expect_usage(ModelCheckpointOptions().train_time_interval(60).every_n_train_steps(5),
               "ModelCheckpoint(every_n_train_steps=5, train_time_interval=60.0): every_n_epochs, every_n_train_steps "
               "and train_time_interval are mutually exclusive; set only one of them");
  expect_usage(ModelCheckpointOptions().train_time_interval(60).every_n_epochs(1), "every_n_epochs=1, train_time_interval");
  expect_usage(ModelCheckpointOptions().train_time_interval(-1), "train_time_interval=-1.0) is invalid");
  expect_usage(ModelCheckpointOptions().train_time_interval(std::nan("")), "a finite number > 0");
  try {
    ModelCheckpoint checkpoint(ModelCheckpointOptions().train_time_interval(1).every_n_train_steps(1));
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_EQ(ModelCheckpoint(ModelCheckpointOptions().monitor("val_loss")).name(),
            "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1}");
  // every_n_epochs turned off explicitly goes with it, as in Lightning; a duration is seconds.
  const ModelCheckpoint timed(ModelCheckpointOptions().train_time_interval(std::chrono::minutes(30)).every_n_epochs(0));
  EXPECT_DOUBLE_EQ(timed.options().train_time_interval(), 1800.0);
  EXPECT_EQ(timed.name(), "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, "
                          "'every_n_epochs': 0, 'train_time_interval': 1800.0}");
}

/// Every training batch lasts at least `ms` milliseconds; added before ModelCheckpoint, which
/// reads its clock after the sleep.
struct SlowSteps : Callback {
  explicit SlowSteps(int ms) : ms(ms) {}
  std::string name() const override { return "SlowSteps"; }
  void on_train_batch_end(TrainerView&, TrainingModule&, const torch::Tensor&, int64_t) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  int ms;
};

std::vector<int64_t> saved_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  static const std::regex step(R"(step=(\d+)\.ckpt$)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_search(name, m, step)) steps.push_back(std::stoll(m[1]));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// 12 steps of 200 ms: saves after steps 4, 8 and 12 (each give or take one, see above), mid-epoch.
TEST_F(ModelCheckpointTest, TrainTimeIntervalSavesWhenTheIntervalHasPassed) {
  Trainer trainer(options(1).max_steps(12));
  trainer.add_callback(std::make_shared<SlowSteps>(200));
  trainer.add_callback(std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions().dirpath((root / "ckpts").string()).train_time_interval(0.7).save_top_k(-1)));
  trainer.fit(std::make_shared<testing::Regressor>(),
              std::make_shared<DataLoader>(regression_data(192), DataLoaderOptions(16)));
  const auto saves = saved_steps(root / "ckpts");
  testing::expect_saves_every_0_7_seconds(saves, 0, 12);
  for (int64_t step : saves) {
    const auto path = in_dir("epoch=0-step=" + std::to_string(step) + ".ckpt");
    EXPECT_EQ(checkpoint::CheckpointIO().load(path).at("global_step").toInt(), step) << path;
  }
}

// The clock starts again when a resumed fit starts (no time is kept in the checkpoint, as in
// Lightning): the resumed run keeps its step count, the earlier run's files and its own saves'
// rhythm, counted from the resumed step.
TEST_F(ModelCheckpointTest, TrainTimeIntervalCountsOnFromTheResumedStep) {
  auto run = [&](int64_t max_steps, const std::string& ckpt_path) {
    Trainer trainer(options(2).max_steps(max_steps).ckpt_path(ckpt_path));
    trainer.add_callback(std::make_shared<SlowSteps>(200));
    trainer.add_callback(std::make_shared<ModelCheckpoint>(ModelCheckpointOptions()
                                                               .dirpath((root / "ckpts").string())
                                                               .train_time_interval(0.7)
                                                               .save_top_k(-1)
                                                               .save_last(true)));
    trainer.fit(std::make_shared<testing::Regressor>(),
                std::make_shared<DataLoader>(regression_data(192), DataLoaderOptions(16)));
    return trainer.global_step();
  };
  ASSERT_EQ(run(6, ""), 6);
  const auto before = saved_steps(root / "ckpts");
  testing::expect_saves_every_0_7_seconds(before, 0, 6);
  const auto resumed_at = checkpoint::CheckpointIO().load(in_dir("last.ckpt")).at("global_step").toInt();
  ASSERT_EQ(resumed_at, 6) << "last.ckpt is written when fit ends at max_steps";
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // longer than the interval: must not count
  ASSERT_EQ(run(14, in_dir("last.ckpt")), 14);
  std::vector<int64_t> after;
  for (int64_t step : saved_steps(root / "ckpts")) {
    if (step > resumed_at) after.push_back(step);
  }
  testing::expect_saves_every_0_7_seconds(after, resumed_at, 14);  // after steps 10 and 14
  EXPECT_EQ(saved_steps(root / "ckpts").size(), before.size() + after.size()) << "the first run's files stay";
  EXPECT_EQ(checkpoint::CheckpointIO().load(in_dir("last.ckpt")).at("global_step").toInt(), 14);
}

}  // namespace
}  // namespace model_checkpoint_test
}  // namespace lockstep
