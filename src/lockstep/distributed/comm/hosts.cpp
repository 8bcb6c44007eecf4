#include "hosts.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

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

HostSegment join_host_segment(ProcessGroup& group, int64_t slot_bytes, const std::string& refused,
                              const std::string& host, const std::string& purpose, bool one_host,
                              std::string* why_not) {
  HostSegment joined;
  // The hosts, each with its ranks in rank order; this rank's host and place on it.
  joined.hosts = ranks_by_host(gather_strings(group, host.empty() ? host_key() : host, purpose + " hosts"));
  const auto& hosts = joined.hosts;
  joined.members = *std::find_if(hosts.begin(), hosts.end(), [&](const std::vector<int>& ranks) {
    return std::find(ranks.begin(), ranks.end(), group.rank()) != ranks.end();
  });
  const auto& members = joined.members;
  const int local_size = static_cast<int>(members.size());
  joined.local_rank = static_cast<int>(std::find(members.begin(), members.end(), group.rank()) - members.begin());
  const bool leader = joined.local_rank == 0;

  std::string error = refused;
  if (error.empty()) {
    const bool even = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h.size() == members.size(); });
    if (local_size < 2) error = "no other rank on its host";
    if (!even) error = "hosts with different numbers of ranks";
    if (local_size > kMaxRanks) error = "more than " + std::to_string(kMaxRanks) + " ranks on one host";
    if (one_host && hosts.size() > 1) error = "ranks on " + std::to_string(hosts.size()) + " hosts";
  }
  // The first rank of each host creates its segment; the others open it through /proc.
  int fd = -1;
  std::unique_ptr<SharedMemorySegment> memory;
  nlohmann::json offer = {{"path", ""}, {"token", 0}};
  if (leader && error.empty()) memory = create_segment(local_size, slot_bytes, &fd, &offer, &error);
  const auto offers = gather_strings(group, leader ? offer.dump() : "", purpose + " offers");
  offer = nlohmann::json::parse(offers[members.front()]);
  const std::string path = offer["path"];
  if (!leader && error.empty() && !path.empty()) {
    memory = attach_segment(path, offer["token"].get<uint64_t>(), local_size, slot_bytes, &fd, &error);
  }
  // Everyone has opened it (or failed): the file descriptors are no longer needed.
  const auto errors = gather_strings(group, error, purpose + " answers");
  if (fd >= 0) close(fd);
  const std::string reason = describe_refusals(errors);
  if (!reason.empty() || path.empty()) {
    if (why_not) *why_not = reason;
    return joined;
  }
  memory->header().pids[joined.local_rank] = getpid();
  joined.memory = std::move(memory);
  return joined;
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
