// model_summary: Lightning's ModelSummary table (max_depth 1) for a module with a frozen part and
// a part in eval mode; counts as Lightning writes them.
#include <lockstep/core/model_summary.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep {
namespace model_summary_test {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 128));         // 100,480 parameters
    bn = register_module("bn", torch::nn::BatchNorm1d(128));           // 256 (its running stats are buffers)
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));          // 1,290, frozen below
    tied = register_parameter("tied", fc1->bias);                      // fc1's bias again: counted once
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor tied;
};

TEST(ModelSummary, TableOfThePartsAndTheTotalsAsLightningPrintsThem) {
  Net net;
  for (auto& p : net.fc2->parameters()) p.set_requires_grad(false);
  net.bn->eval();
  EXPECT_EQ(model_summary(net),
            "  | Name | Type        | Params | Mode \n"
            "---------------------------------------\n"
            "0 | fc1  | Linear      | 100 K  | train\n"
            "1 | bn   | BatchNorm1d | 256    | eval \n"
            "2 | fc2  | Linear      | 1.3 K  | train\n"
            "---------------------------------------\n"
            "100 K     Trainable params\n"
            "1.3 K     Non-trainable params\n"
            "102 K     Total params\n"
            "0.408     Total estimated model params size (MB)\n"
            "3         Modules in train mode\n"
            "1         Modules in eval mode\n");
}

TEST(ModelSummary, CountsReadAsLightningsGetHumanReadableCount) {
  EXPECT_EQ(human_readable_count(0), "0  ");
  EXPECT_EQ(human_readable_count(999), "999  ");
  EXPECT_EQ(human_readable_count(1234), "1.2 K");
  EXPECT_EQ(human_readable_count(101770), "101 K");
  EXPECT_EQ(human_readable_count(24'214'538), "24.2 M");
  EXPECT_EQ(human_readable_count(103'900'000), "103 M");
  EXPECT_EQ(human_readable_count(1'500'000'000), "1.5 B");
}

}  // namespace model_summary_test
}  // namespace lockstep
