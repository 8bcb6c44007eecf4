// from_lightning_checkpoint (checkpoint/lightning_checkpoint.h) on checkpoints laid out as
// Lightning 2.6 writes them: what maps where, the note, and each mismatch refused with its fix.
// tests/tools/lightning_checkpoint_test.cpp resumes files that Lightning itself wrote.
#include <lockstep/checkpoint/lightning_checkpoint.h>
#include <lockstep/checkpoint/optimizer_state.h>
#include <lockstep/core/error.h>

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace lockstep {
namespace checkpoint {
namespace lightning_checkpoint_test {

using Dict = c10::impl::GenericDict;

Dict dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

Dict counts(int64_t ready, int64_t completed, int64_t processed) {
  Dict d = dict();
  d.insert("ready", ready);
  d.insert("started", ready);
  d.insert("processed", processed);
  d.insert("completed", completed);
  return d;
}

Dict progress(const Dict& current) {
  Dict d = dict();
  d.insert("total", current);
  d.insert("current", current);
  return d;
}

// Lightning's "loops" after `batches` batches of the epoch (`last`: all of them) with the
// epoch counts ready (and started), completed, processed.
Dict loops_at(int64_t batches, bool last, int64_t ready, int64_t completed, int64_t processed) {
  Dict batch_progress = progress(counts(batches, batches, batches));
  batch_progress.insert("is_last_batch", last);
  Dict fit = dict();
  fit.insert("epoch_progress", progress(counts(ready, completed, processed)));
  fit.insert("epoch_loop.batch_progress", batch_progress);
  Dict loops = dict();
  loops.insert("fit_loop", fit);
  return loops;
}

// A module "net" with one Linear(3, out), its Adam and a StepLR, as the C++ side configures them.
struct Side {
  explicit Side(int64_t out = 2) {
    module = std::make_shared<torch::nn::Module>();
    module->register_module("net", torch::nn::Sequential(torch::nn::Linear(3, out)));
    config.optimizers.push_back(std::make_shared<torch::optim::Adam>(module->parameters(), 1e-3));
    config.schedulers.push_back({std::make_shared<torch::optim::StepLR>(*config.optimizers[0], 1, 0.5), "epoch"});
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> names() const {
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (const auto& p : module->named_parameters()) out.emplace_back(p.key(), p.value().sizes().vec());
    return out;
  }
  std::shared_ptr<torch::nn::Module> module;
  OptimizerConfig config;
};

// What Lightning writes at the end of epoch 1 (two epochs' batches ran, the second not yet
// completed) for a LightningModule that holds the network as `self.model`.
Checkpoint lightning_file(const Side& side) {
  Checkpoint ckpt = make_checkpoint();
  ckpt.insert("epoch", int64_t{1});
  ckpt.insert("global_step", int64_t{10});
  ckpt.insert("pytorch-lightning_version", std::string("2.6.6"));
  Dict state = dict();
  for (const auto& p : side.module->named_parameters()) state.insert("model." + p.key().substr(4), p.value().detach() + 1);
  ckpt.insert("state_dict", state);
  torch::optim::Adam python_adam(side.module->parameters(), 2e-3);  // a state to carry over
  for (auto& p : side.module->parameters()) p.mutable_grad() = torch::ones_like(p);
  python_adam.step();
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(optimizer_state_dict(python_adam));
  ckpt.insert("optimizer_states", optimizers);
  Dict scheduler = dict();
  scheduler.insert("last_epoch", int64_t{2});
  scheduler.insert("lr_lambdas", c10::impl::GenericList(c10::AnyType::get()));
  c10::impl::GenericList schedulers(c10::AnyType::get());
  schedulers.push_back(scheduler);
  ckpt.insert("lr_schedulers", schedulers);
  ckpt.insert("loops", loops_at(5, true, 2, 1, 2));
  Dict callbacks = dict();
  callbacks.insert("ModelCheckpoint{'monitor': None}", dict());
  ckpt.insert("callbacks", callbacks);
  Dict hparams = dict();
  hparams.insert("lr", 2e-3);
  ckpt.insert("hyper_parameters", hparams);
  return ckpt;
}

std::string refusal(const Checkpoint& ckpt, const Side& side, const KeyMap& rename = KeyMap()) {
  try {
    from_lightning_checkpoint(ckpt, side.names(), side.config, rename, "in.ckpt");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LightningCheckpoint, IsKnownByItsVersionKeyNotItsName) {
  Side side;
  EXPECT_TRUE(is_lightning_checkpoint(lightning_file(side)));
  Checkpoint own = make_checkpoint();
  own.insert("state_dict", dict());
  EXPECT_FALSE(is_lightning_checkpoint(own));
}

TEST(LightningCheckpoint, WeightsOptimizerSchedulersAndThePositionMapOntoTheTrainersLayout) {
  Side side;
  const Checkpoint file = lightning_file(side);
  const auto resume = from_lightning_checkpoint(file, side.names(), side.config, KeyMap(), "in.ckpt");
  const auto state = resume.checkpoint.at("state_dict").toGenericDict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_TRUE(state.at("net.0.weight").toTensor().equal(file.at("state_dict").toGenericDict().at("model.0.weight").toTensor()));
  EXPECT_TRUE(state.contains("net.0.bias"));
  // The optimizer state passes as it is, and loads into the C++ Adam.
  const auto optimizers = resume.checkpoint.at("optimizer_states").toList();
  ASSERT_EQ(optimizers.size(), 1u);
  load_optimizer_state_dict(*side.config.optimizers[0], optimizers.get(0).toGenericDict());
  EXPECT_EQ(side.config.optimizers[0]->param_groups()[0].options().get_lr(), 2e-3);
  EXPECT_EQ(resume.checkpoint.at("lr_schedulers").toGenericDict().at("epoch_steps").toInt(), 2);
  EXPECT_EQ(resume.checkpoint.at("lr_schedulers").toGenericDict().at("step_steps").toInt(), 0);
  // Epoch 1's batches all ran: epoch 2 is next, as in Lightning.
  EXPECT_EQ(resume.checkpoint.at("loops").toGenericDict().at("next_epoch").toInt(), 2);
  EXPECT_EQ(resume.checkpoint.at("loops").toGenericDict().at("next_batch").toInt(), 0);
  EXPECT_EQ(resume.checkpoint.at("global_step").toInt(), 10);
  for (const char* part : {"Lightning 2.6.6", "continues at epoch 2 ", "'model.=net.'", "(Adam)", "global step 10",
                           "Not carried over", "ModelCheckpoint{'monitor': None}", "\"hyper_parameters\" ('lr')",
                           "lr_lambdas", "the loops' counters"}) {
    EXPECT_NE(resume.note.find(part), std::string::npos) << part << " in: " << resume.note;
  }
}

TEST(LightningCheckpoint, AMidEpochFileContinuesAfterTheBatchesItRan) {
  Side side;
  Checkpoint file = lightning_file(side);
  file.insert_or_assign("loops", loops_at(3, false, 2, 1, 1));
  const auto resume = from_lightning_checkpoint(file, side.names(), side.config, KeyMap(), "in.ckpt");
  EXPECT_EQ(resume.checkpoint.at("loops").toGenericDict().at("next_epoch").toInt(), 1);
  EXPECT_EQ(resume.checkpoint.at("loops").toGenericDict().at("next_batch").toInt(), 3);
  EXPECT_NE(resume.note.find("mid-epoch"), std::string::npos) << resume.note;
}

TEST(LightningCheckpoint, MismatchesAreRefusedNamingThemAndTheFix) {
  Side side;
  const Checkpoint file = lightning_file(side);
  EXPECT_NE(refusal(file, Side(4)).find("of another model: 'net.0.weight' is [2, 3] in the file and [4, 3]"),
            std::string::npos) << refusal(file, Side(4));
  // Rules that do not give the module's names: the fix names --ckpt-path-rename.
  const std::string names = refusal(file, side, KeyMap().rename_prefix("model.", "body."));
  EXPECT_NE(names.find("the module lacks 'body.0.weight'"), std::string::npos) << names;
  EXPECT_NE(names.find("--ckpt-path-rename"), std::string::npos) << names;
  Checkpoint rmsprop = lightning_file(side);
  auto group = rmsprop.at("optimizer_states").toList().get(0).toGenericDict().at("param_groups").toListRef()[0].toGenericDict();
  group.insert("alpha", 0.99);
  (void)group.erase("betas");
  EXPECT_NE(refusal(rmsprop, side).find("torch.optim.RMSprop, whose state Lockstep cannot restore"), std::string::npos);
  group.insert("betas", c10::ivalue::Tuple::create({0.9, 0.999}));
  (void)group.erase("alpha");
  group.insert("decoupled_weight_decay", true);
  EXPECT_NE(refusal(rmsprop, side).find("is torch.optim.AdamW and configure_optimizers returns Adam"), std::string::npos)
      << refusal(rmsprop, side);
  Checkpoint weights_only = lightning_file(side);
  (void)weights_only.erase("optimizer_states");
  EXPECT_NE(refusal(weights_only, side).find("save_weights_only=True) writes. Start from its weights with --init-weights "
                                             "in.ckpt instead"), std::string::npos) << refusal(weights_only, side);
  Side unscheduled;
  unscheduled.config.schedulers.clear();
  EXPECT_NE(refusal(file, unscheduled).find("1 LR scheduler state(s) and configure_optimizers returns 0"),
            std::string::npos) << refusal(file, unscheduled);
}

}  // namespace lightning_checkpoint_test
}  // namespace checkpoint
}  // namespace lockstep
