#include <lockstep/strategies/registry.h>

#include <map>
#include <mutex>

#include <lockstep/core/error.h>

namespace lockstep {
namespace strategies {
namespace {

struct Entry {
  StrategyFactory factory;
  std::string description;
};

std::map<std::string, Entry>& entries() {
  static std::map<std::string, Entry> table;
  return table;
}

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

const bool single_device_registered = register_strategy(
    "single_device", [] { return std::make_shared<SingleDeviceStrategy>(); }, "one process on one device");

}  // namespace

bool register_strategy(const std::string& name, StrategyFactory factory, const std::string& description) {
  std::lock_guard<std::mutex> lock(table_mutex());
  entries()[name] = Entry{std::move(factory), description};
  return true;
}

std::shared_ptr<Strategy> create_strategy(const std::string& name) {
  StrategyFactory factory;
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    const auto it = entries().find(name);
    if (it != entries().end()) factory = it->second.factory;
  }
  if (!factory) {
    std::string names;
    for (const auto& n : available_strategies()) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("--strategy '" + name + "' is not registered. Use auto or one of: " + names + ".");
  }
  return factory();
}

bool is_registered(const std::string& name) {
  std::lock_guard<std::mutex> lock(table_mutex());
  return entries().count(name) > 0;
}

std::vector<std::string> available_strategies() {
  std::lock_guard<std::mutex> lock(table_mutex());
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries()) names.push_back(name);
  return names;
}

}  // namespace strategies
}  // namespace lockstep
