#include <lockstep/environments/lsf_environment.h>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>

namespace lockstep {
namespace environments {
namespace {

const char* const kSetByJsrun =
    "jsrun sets it for every task. Start the program with jsrun (e.g. jsrun -n 8 -r 4 ./train), "
    "or set it to the value jsrun would use.";

std::string trim(const std::string& text) {
  const char* space = " \t\r\n";
  auto first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

std::string short_name(const std::string& host) { return host.substr(0, host.find('.')); }

std::string this_hostname() {
  char buffer[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) {
    throw EnvironmentError(
        "Cannot read this machine's host name (gethostname failed), so its node rank in the LSF "
        "job is unknown. Check the system's host name configuration.");
  }
  return buffer;
}

// Index of `host` in `hosts`: an exact match first, else one on the short names.
std::optional<int> find_host(const std::vector<std::string>& hosts, const std::string& host) {
  auto exact = std::find(hosts.begin(), hosts.end(), host);
  if (exact != hosts.end()) return static_cast<int>(exact - hosts.begin());
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (short_name(hosts[i]) == short_name(host)) return static_cast<int>(i);
  }
  return std::nullopt;
}

// Lightning's rule: the job id modulo 1000, in the 10k range.
int lsf_port_from_job_id(const std::string& job_id) {
  bool numeric = !job_id.empty() && job_id.size() <= 18;
  for (char c : job_id) numeric = numeric && c >= '0' && c <= '9';
  if (!numeric) {
    throw EnvironmentError("LSB_JOBID=" + job_id +
                           " is not a job number, so no port can be derived from it. Set "
                           "MASTER_PORT to a free port, e.g. MASTER_PORT=29500.");
  }
  return 10000 + static_cast<int>(std::stoll(job_id) % 1000);
}

}  // namespace

std::vector<std::string> read_lsf_rankfile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    throw EnvironmentError("Cannot read the LSF rank file LSB_DJOB_RANKFILE=" + path +
                           ". LSF writes it for every job; check that the path exists on this "
                           "node and is readable, and run inside the job (bsub ... jsrun).");
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(file, line)) {
    line = trim(line);
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.size() < 2) {
    throw EnvironmentError("The LSF rank file LSB_DJOB_RANKFILE=" + path +
                           " lists no compute host (its first line is the launch node, the "
                           "rest one line per task slot). Run inside a job started by bsub.");
  }
  lines.erase(lines.begin());
  return lines;
}

bool LSFEnvironment::detect(const Environ& env) {
  return env.has("LSB_JOBID") && env.has("LSB_DJOB_RANKFILE") &&
         env.has("JSM_NAMESPACE_LOCAL_RANK") && env.has("JSM_NAMESPACE_SIZE");
}

LSFEnvironment::LSFEnvironment(const Environ& env, std::optional<std::string> hostname) {
  placement_.world_size = detail::require_int(env, "JSM_NAMESPACE_SIZE", kSetByJsrun);
  placement_.global_rank = detail::require_int(env, "JSM_NAMESPACE_RANK", kSetByJsrun);
  placement_.local_rank = detail::require_int(env, "JSM_NAMESPACE_LOCAL_RANK", kSetByJsrun);
  detail::check_positive("JSM_NAMESPACE_SIZE", placement_.world_size);
  detail::check_rank_below("JSM_NAMESPACE_RANK", placement_.global_rank, "JSM_NAMESPACE_SIZE", placement_.world_size);
  detail::check_rank_below("JSM_NAMESPACE_LOCAL_RANK", placement_.local_rank, "JSM_NAMESPACE_SIZE",
                           placement_.world_size);

  auto rankfile = env.get("LSB_DJOB_RANKFILE");
  if (!rankfile || rankfile->empty()) {
    throw EnvironmentError("LSB_DJOB_RANKFILE is not set or empty: LSF sets it to the job's "
                           "rank file. Run inside a job started by bsub.");
  }
  for (const auto& host : read_lsf_rankfile(*rankfile)) {
    if (std::find(hosts_.begin(), hosts_.end(), host) == hosts_.end()) hosts_.push_back(host);
  }
  std::string host = hostname ? *hostname : this_hostname();
  auto index = find_host(hosts_, host);
  if (!index) {
    std::string listed;
    for (const auto& h : hosts_) listed += (listed.empty() ? "" : ", ") + h;
    throw EnvironmentError("This host '" + host + "' is not among the compute hosts of "
                           "LSB_DJOB_RANKFILE=" + *rankfile + " (" + listed +
                           "), so its node rank is unknown. Run the program through jsrun "
                           "inside the job that wrote the rank file.");
  }
  placement_.node_rank = *index;

  placement_.main_address = env.get("MASTER_ADDR").value_or(hosts_.front());
  if (auto port = env.get("MASTER_PORT")) {
    placement_.main_port = detail::parse_port("MASTER_PORT", *port);
  } else {
    placement_.main_port = lsf_port_from_job_id(*env.get("LSB_JOBID"));
  }
}

void LSFEnvironment::validate_settings(int devices, int num_nodes) const {
  // The rank file lists the whole allocation, which jsrun may use only part of, so the node
  // count cannot be checked; the task count can.
  if (placement_.world_size == devices * num_nodes) return;
  throw EnvironmentError("You set --devices=" + std::to_string(devices) + " --num-nodes=" +
                         std::to_string(num_nodes) + " (" + std::to_string(devices * num_nodes) +
                         " processes in all) but jsrun started JSM_NAMESPACE_SIZE=" +
                         std::to_string(placement_.world_size) +
                         " tasks. Use --devices and --num-nodes whose product is " +
                         std::to_string(placement_.world_size) + ", or jsrun -n " +
                         std::to_string(devices * num_nodes) + " -r " + std::to_string(devices) +
                         ".");
}

}  // namespace environments
}  // namespace lockstep
