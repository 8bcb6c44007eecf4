// --enable-model-summary (on by default, as Lightning): fit prints the module's table once on
// rank 0, before training, to stderr; false prints none.
#include <lockstep/trainer/trainer.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lockstep/core/model_summary.h>

#include "../../support/regression.h"
#include "../../support/trainer_runs.h"

namespace lockstep {
namespace trainer_model_summary_test {

size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(TrainerModelSummary, FitPrintsTheModulesTableOnceUnlessTurnedOff) {
  for (const bool on : {true, false}) {
    testing::TempDir dir("lockstep_model_summary");
    Trainer trainer(testing::quiet_options(dir).max_epochs(2).enable_model_summary(on));
    auto model = std::make_shared<testing::Regressor>();
    ::testing::internal::CaptureStderr();
    trainer.fit(model, testing::loader_of(testing::regression_data(32), 16));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(occurrences(err, "Total params"), on ? 1u : 0u) << err;
    if (on) EXPECT_NE(err.find(model_summary(*model)), std::string::npos) << err;
  }
}

}  // namespace trainer_model_summary_test
}  // namespace lockstep
