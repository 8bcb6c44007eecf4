#include <lockstep/checkpoint/key_map.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include <lockstep/core/error.h>

#include "prefix_rule.h"

namespace lockstep {
namespace checkpoint {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// Whether a name part starts at `pos` of `key` ("fc1" in "model.fc1.weight" starts at 6).
bool part_starts_at(const std::string& key, std::size_t pos) { return pos == 0 || key[pos - 1] == '.'; }

// The rule that turns `from` into `to` by their longest common tail of whole name parts.
std::pair<std::string, std::string> rule_between(const std::string& from, const std::string& to) {
  std::size_t tail = 0;
  while (tail < from.size() && tail < to.size() && from[from.size() - 1 - tail] == to[to.size() - 1 - tail]) ++tail;
  while (tail > 0 && !(part_starts_at(from, from.size() - tail) && part_starts_at(to, to.size() - tail))) --tail;
  if (tail == 0) return {"", ""};
  return {from.substr(0, from.size() - tail), to.substr(0, to.size() - tail)};
}

}  // namespace

KeyMap& KeyMap::rename_prefix(std::string from, std::string to) {
  rules_.emplace_back(std::move(from), std::move(to));
  return *this;
}

KeyMap KeyMap::parse(const std::string& text) {
  KeyMap map;
  std::size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string rule = text.substr(begin, end - begin);
    const std::size_t equals = rule.find('=');
    if (equals == std::string::npos) {
      throw UsageError("key-map rule '" + rule + "' in '" + text + "' has no '=': write FROM=TO, e.g. 'model.=' to "
                       "strip the prefix model. or 'net.=backbone.' to rename it, several separated by commas.");
    }
    map.rename_prefix(rule.substr(0, equals), rule.substr(equals + 1));
    begin = end + 1;
  }
  return map;
}

std::string KeyMap::apply(const std::string& key) const {
  for (const auto& [from, to] : rules_) {
    if (starts_with(key, from)) return to + key.substr(from.size());
  }
  return key;
}

c10::impl::GenericDict KeyMap::apply(const c10::impl::GenericDict& state) const {
  if (rules_.empty()) return state;
  c10::impl::GenericDict out(state.keyType(), state.valueType());
  std::map<std::string, std::string> source_of;  // renamed key -> the file's key
  for (const auto& entry : state) {
    if (!entry.key().isString()) {
      out.insert(entry.key(), entry.value());
      continue;
    }
    const std::string& key = entry.key().toStringRef();
    const std::string renamed = apply(key);
    const auto [it, fresh] = source_of.emplace(renamed, key);
    if (!fresh) {
      throw UsageError("the key map " + str() + " turns both '" + it->second + "' and '" + key + "' into '" + renamed +
                       "'. Give rules that keep the names apart (the first rule whose prefix matches applies).");
    }
    out.insert(renamed, entry.value());
  }
  return out;
}

std::string KeyMap::str() const {
  std::string text;
  for (const auto& [from, to] : rules_) text += (text.empty() ? "" : ",") + from + "=" + to;
  return text;
}

namespace detail {

std::pair<std::string, std::string> suggest_prefix_rule(const std::vector<std::string>& unexpected,
                                                        const std::vector<std::string>& missing) {
  if (unexpected.empty() || missing.empty()) return {"", ""};
  const std::unordered_set<std::string> wanted(missing.begin(), missing.end());
  std::set<std::pair<std::string, std::string>> tried;
  for (const auto& target : missing) {
    const auto rule = rule_between(unexpected.front(), target);
    if (rule.first == rule.second || !tried.insert(rule).second) continue;
    const KeyMap map = KeyMap().rename_prefix(rule.first, rule.second);
    bool explains_all = true;
    for (const auto& key : unexpected) explains_all = explains_all && starts_with(key, rule.first) && wanted.count(map.apply(key));
    if (explains_all) return rule;
  }
  return {"", ""};
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace lockstep
