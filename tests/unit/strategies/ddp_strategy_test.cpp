// DDPStrategy's default configure_ddp uses device_ids as PyTorch's DDP(device_ids=[i]) does: the
// module must be on that device.
#include <lockstep/strategies/ddp_strategy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include "../../support/errors.h"

namespace lockstep {
namespace {

TEST(DDPStrategyDevice, TheDefaultConfigureDdpRefusesAModuleOffItsDevice) {
  const auto module = std::make_shared<torch::nn::LinearImpl>(2, 1);  // on the CPU
  strategies::DDPStrategy strategy;
  const auto message = testing::error_of<UsageError>([&] { strategy.configure_ddp(module, {1}); });
  EXPECT_NE(message.find("DDPStrategy: parameter 'weight' is on cpu but this rank trains on cuda:1 (device_ids)"),
            std::string::npos) << message;
  EXPECT_NE(testing::error_of<UsageError>([&] { strategy.configure_ddp(module, {0, 1}); }).find("give one id"),
            std::string::npos);
  EXPECT_NO_THROW(strategies::DDPStrategy::check_on_device(*module, {})) << "on the CPU: no ids, module on the CPU";
}

}  // namespace
}  // namespace lockstep
