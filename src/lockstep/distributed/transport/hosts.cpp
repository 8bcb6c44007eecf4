#include "hosts.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

namespace lockstep {
namespace distributed {
namespace {

std::string read_link(const std::string& path) {
  char buffer[256];
  const ssize_t n = readlink(path.c_str(), buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

}  // namespace

namespace detail {

std::string host_key() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  boot >> boot_id;
  return std::string(host) + "|" + boot_id + "|" + read_link("/proc/self/ns/pid");
}

std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& keys) {
  std::vector<std::vector<int>> hosts;
  std::vector<std::string> seen;
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    const auto at = static_cast<size_t>(std::find(seen.begin(), seen.end(), keys[r]) - seen.begin());
    if (at == seen.size()) {
      seen.push_back(keys[r]);
      hosts.emplace_back();
    }
    hosts[at].push_back(r);
  }
  return hosts;
}

std::vector<std::string> gather_strings(ProcessGroup& group, const std::string& text, const std::string& tag) {
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  if (!text.empty()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  std::vector<std::string> out;
  for (const auto& part : all_gather(group, bytes, CollectiveOptions().tag(tag))) {
    out.emplace_back(static_cast<const char*>(part.data_ptr()), static_cast<size_t>(part.numel()));
  }
  return out;
}

std::string describe_refusals(const std::vector<std::string>& reasons) {
  std::vector<std::pair<std::string, std::vector<int>>> grouped;
  for (int r = 0; r < static_cast<int>(reasons.size()); ++r) {
    if (reasons[r].empty()) continue;
    auto same = std::find_if(grouped.begin(), grouped.end(), [&](const auto& g) { return g.first == reasons[r]; });
    if (same == grouped.end()) same = grouped.insert(grouped.end(), {reasons[r], {}});
    same->second.push_back(r);
  }
  std::string out;
  for (const auto& [reason, ranks] : grouped) {
    std::string list;
    for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    out += (out.empty() ? "" : "; ") + reason + (ranks.size() > 1 ? " (ranks " : " (rank ") + list + ")";
  }
  return out;
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
