#pragma once
/// FabricCallback: hooks that your loop runs by name with Fabric::call (Lightning Fabric's
/// callbacks, whose methods fabric.call finds by name).

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

namespace lockstep {

///   struct Announce : FabricCallback {
///     Announce() { on("on_train_epoch_end", [](const auto& args) { std::cout << args[0].toInt(); }); }
///   };
///   fabric.add_callback(std::make_shared<Announce>());
///   fabric.call("on_train_epoch_end", {epoch});
class FabricCallback {
 public:
  using Hook = std::function<void(const std::vector<c10::IValue>& args)>;
  virtual ~FabricCallback() = default;

  /// Runs hook `name` with `args`; false when this callback has none of that name.
  bool run(const std::string& name, const std::vector<c10::IValue>& args) const {
    auto it = hooks_.find(name);
    if (it == hooks_.end()) return false;
    it->second(args);
    return true;
  }

 protected:
  /// Registers hook `name` (one per name; a second replaces the first).
  void on(const std::string& name, Hook hook) { hooks_[name] = std::move(hook); }

 private:
  std::map<std::string, Hook> hooks_;
};

}  // namespace lockstep
