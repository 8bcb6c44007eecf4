// KeyMap (checkpoint/key_map.h): renaming a file's state_dict names to a module's, and the rule
// that a mismatch message suggests (src/lockstep/checkpoint/prefix_rule.h).
#include <lockstep/checkpoint/key_map.h>
#include <lockstep/core/error.h>

#include "../../../src/lockstep/checkpoint/prefix_rule.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace lockstep {
namespace checkpoint {
namespace key_map_test {

c10::impl::GenericDict dict_of(const std::vector<std::string>& keys) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (size_t i = 0; i < keys.size(); ++i) out.insert(keys[i], torch::full({1}, static_cast<double>(i)));
  return out;
}

std::vector<std::string> keys_of(const c10::impl::GenericDict& dict) {
  std::vector<std::string> keys;
  for (const auto& entry : dict) keys.push_back(entry.key().toStringRef());
  return keys;
}

TEST(KeyMap, TheFirstMatchingRuleRenamesAKeyAndOthersStay) {
  const auto map = KeyMap().rename_prefix("model.", "").rename_prefix("net.backbone.", "backbone.");
  EXPECT_EQ(map.apply("model.fc1.weight"), "fc1.weight");
  EXPECT_EQ(map.apply("net.backbone.0.bias"), "backbone.0.bias");
  EXPECT_EQ(map.apply("head.weight"), "head.weight");
  EXPECT_EQ(KeyMap().rename_prefix("", "net.").apply("fc.weight"), "net.fc.weight");
  const auto renamed = map.apply(dict_of({"model.a", "head.b", "model.c"}));
  EXPECT_EQ(keys_of(renamed), (std::vector<std::string>{"a", "head.b", "c"}));  // the file's order
  EXPECT_TRUE(renamed.at("c").toTensor().equal(torch::full({1}, 2.0)));
}

TEST(KeyMap, ParseReadsTheTrainerFlagsRulesAndNamesABadOne) {
  const auto map = KeyMap::parse("model.=,net.backbone.=backbone.");
  EXPECT_EQ(map.str(), "model.=,net.backbone.=backbone.");
  EXPECT_EQ(map.apply("model.x"), "x");
  EXPECT_TRUE(KeyMap::parse("").empty());
  try {
    KeyMap::parse("model.=,net.");
    ADD_FAILURE() << "a rule without '=' was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'net.'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FROM=TO"), std::string::npos) << e.what();
  }
}

TEST(KeyMap, TwoKeysThatBecomeOneAreAnErrorNamingBoth) {
  try {
    KeyMap().rename_prefix("model.", "").apply(dict_of({"model.w", "w"}));
    ADD_FAILURE() << "two keys became one silently";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.w' and 'w' into 'w'"), std::string::npos) << e.what();
  }
}

TEST(KeyMap, TheSuggestedRuleExplainsEveryUnexpectedKeyOrThereIsNone) {
  using detail::suggest_prefix_rule;
  using Rule = std::pair<std::string, std::string>;
  EXPECT_EQ(suggest_prefix_rule({"model.0.weight", "model.0.bias"}, {"0.weight", "0.bias"}), Rule("model.", ""));
  EXPECT_EQ(suggest_prefix_rule({"fc.weight"}, {"net.fc.weight", "net.fc.bias"}), Rule("", "net."));
  EXPECT_EQ(suggest_prefix_rule({"module.net.fc.w"}, {"backbone.fc.w"}), Rule("module.net.", "backbone."));
  EXPECT_EQ(suggest_prefix_rule({"model.a", "other.b"}, {"a", "b"}), Rule("", ""));  // no one rule
  EXPECT_EQ(suggest_prefix_rule({"fc1.weight"}, {"fc2.weight"}), Rule("fc1.", "fc2."));  // a renamed layer
  EXPECT_EQ(suggest_prefix_rule({"fc1.weight", "fc1.bias"}, {"fc2.weight"}), Rule("", ""));
  EXPECT_EQ(suggest_prefix_rule({}, {"a"}), Rule("", ""));
}

}  // namespace key_map_test
}  // namespace checkpoint
}  // namespace lockstep
