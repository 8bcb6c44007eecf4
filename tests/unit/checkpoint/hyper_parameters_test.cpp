// hparams() in a checkpoint (checkpoint/hyper_parameters.h): every JSON type through a saved and
// loaded file keeps its type.
#include <lockstep/checkpoint/hyper_parameters.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>

#include "../../support/temp_dir.h"

namespace lockstep {
namespace checkpoint {
namespace hyper_parameters_test {

const nlohmann::json kHparams = {{"lr", 0.05},         {"epochs", 3},      {"big", uint64_t{1} << 63},
                                 {"amsgrad", true},    {"name", "mlp"},    {"nothing", nullptr},
                                 {"layers", {512, 256}}, {"optim", {{"betas", {0.9, 0.999}}, {"eps", 1e-8}}},
                                 {"empty", nlohmann::json::object()}};

}  // namespace hyper_parameters_test

namespace {

using hyper_parameters_test::kHparams;

TEST(HyperParameters, EveryTypeSurvivesASavedAndLoadedCheckpoint) {
  testing::TempDir dir("lockstep_hparams");
  auto ckpt = make_checkpoint();
  ckpt.insert("hyper_parameters", hyper_parameters_value(kHparams));
  CheckpointIO().save(ckpt, dir.path() + "/h.ckpt");
  const auto back = hparams_of(CheckpointIO().load(dir.path() + "/h.ckpt"));
  auto expected = kHparams;
  expected["big"] = static_cast<double>(uint64_t{1} << 63);  // beyond int64: a float, as torch.load reads it
  EXPECT_EQ(back, expected) << back.dump();
  EXPECT_TRUE(back.at("lr").is_number_float());
  EXPECT_TRUE(back.at("epochs").is_number_integer());
  EXPECT_TRUE(back.at("amsgrad").is_boolean());
  EXPECT_TRUE(back.at("nothing").is_null());
  EXPECT_TRUE(back.at("optim").at("betas").is_array());
}

// A Lightning checkpoint's hyper_parameters may hold what JSON cannot: a tuple is a list, a
// one-element tensor its number, anything else a description; a file without them reads as {}.
TEST(HyperParameters, WhatJsonCannotHoldIsReadAsTheNearestValueNeverAnError) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("betas", c10::ivalue::Tuple::create({0.9, 0.99}));
  dict.insert("scale", torch::tensor(2.5));
  dict.insert("mask", torch::ones({2, 3}));
  auto ckpt = make_checkpoint();
  ckpt.insert("hyper_parameters", dict);
  const auto back = hparams_of(ckpt);
  EXPECT_EQ(back.at("betas"), nlohmann::json({0.9, 0.99}));
  EXPECT_EQ(back.at("scale"), 2.5);
  EXPECT_EQ(back.at("mask"), "tensor of shape [2, 3] (Float)");
  EXPECT_EQ(hparams_of(make_checkpoint()), nlohmann::json::object());
}

TEST(HyperParameters, ABinaryValueIsAUsageError) {
  EXPECT_THROW(hyper_parameters_value({{"blob", nlohmann::json::binary({1, 2})}}), UsageError);
}

}  // namespace
}  // namespace checkpoint
}  // namespace lockstep
