#pragma once
/// KeyMap: renames the keys of a state_dict from the names in a file to the names of a module.
/// Weights saved in Python often carry the attribute that held the network: "model.fc1.weight"
/// from a LightningModule's `self.model`, "module.fc1.weight" from DistributedDataParallel,
/// "net.fc1.weight" from a wrapper, where the C++ module has plain "fc1.weight".

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>

namespace lockstep {
namespace checkpoint {

/// Prefix rules, tried in order; the first whose prefix starts a key renames it, and a key that
/// no rule matches stays as it is. No rules (the default): every key stays.
///   auto keys = KeyMap().rename_prefix("model.", "");        // model.fc1.weight -> fc1.weight
///   fabric.load_raw("weights.pt", model, /*strict=*/true, keys);
///   auto same = KeyMap::parse("model.=,net.backbone.=backbone.");  // the Trainer's --init-weights-rename
class KeyMap {
 public:
  /// Keys that start with `from` start with `to` instead; `from` "" puts `to` before every key.
  KeyMap& rename_prefix(std::string from, std::string to = "");
  /// Rules written "FROM=TO" and separated by commas ("model.=" strips "model."). A rule without
  /// '=' is a UsageError naming it.
  static KeyMap parse(const std::string& text);

  bool empty() const { return rules_.empty(); }
  /// `key` renamed by the first rule that matches it.
  std::string apply(const std::string& key) const;
  /// `state` with every string key renamed, in its order. Two keys that become one are a
  /// UsageError naming both.
  c10::impl::GenericDict apply(const c10::impl::GenericDict& state) const;
  /// The rules as parse() reads them: "model.=,net.=backbone.".
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> rules_;
};

}  // namespace checkpoint
}  // namespace lockstep
