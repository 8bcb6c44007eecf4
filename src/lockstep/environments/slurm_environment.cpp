#include <lockstep/environments/slurm_environment.h>

#include <cctype>
#include <cstddef>

namespace lockstep {
namespace environments {
namespace {

constexpr long long kMaxHosts = 1000000;

const char* const kSetBySrun =
    "srun sets it for every task. Start the program with srun (e.g. srun --ntasks-per-node=4 "
    "./train --devices 4), or run it with SLURM_JOB_NAME=interactive to let Lockstep start the "
    "processes itself.";

// One numeric range of a bracket group: [lo-hi], printed with at least `width` digits.
struct Range {
  long long lo = 0;
  long long hi = 0;
  std::size_t width = 0;
};

// A run of literal characters, or a bracket group when `ranges` is not empty.
struct Piece {
  std::string text;
  std::vector<Range> ranges;
};

using Entry = std::vector<Piece>;

EnvironmentError malformed(const std::string& nodelist, const std::string& what) {
  return EnvironmentError("Malformed SLURM node list '" + nodelist + "': " + what +
                          ". SLURM writes node lists like node[01-03,7],gpu-a; check "
                          "SLURM_NODELIST, or set MASTER_ADDR to the host of rank 0.");
}

bool is_separator(char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); }

// Splits at commas and whitespace outside brackets. A comma must sit between two entries;
// whitespace runs may not produce empty entries.
std::vector<std::string> split_entries(const std::string& nodelist) {
  std::vector<std::string> entries;
  std::string current;
  bool in_bracket = false;
  bool comma_pending = false;  // a comma was seen and still needs an entry after it
  for (std::size_t i = 0; i < nodelist.size(); ++i) {
    char c = nodelist[i];
    if (c == '[') {
      if (in_bracket) throw malformed(nodelist, "nested '[' at position " + std::to_string(i));
      in_bracket = true;
    } else if (c == ']') {
      if (!in_bracket) {
        throw malformed(nodelist, "']' at position " + std::to_string(i) + " has no '['");
      }
      in_bracket = false;
    }
    if (in_bracket || !is_separator(c)) {
      current += c;
      comma_pending = false;
      continue;
    }
    if (!current.empty()) {
      entries.push_back(current);
      current.clear();
    }
    if (c == ',') {
      if (entries.empty() || comma_pending) {
        throw malformed(nodelist, "empty entry before the ',' at position " + std::to_string(i));
      }
      comma_pending = true;
    }
  }
  if (in_bracket) throw malformed(nodelist, "a '[' is never closed");
  if (!current.empty()) entries.push_back(current);
  if (comma_pending) throw malformed(nodelist, "empty entry after the last ','");
  if (entries.empty()) throw malformed(nodelist, "no host in it");
  return entries;
}

long long parse_bound(const std::string& nodelist, const std::string& bound,
                      const std::string& item) {
  if (bound.empty() || bound.size() > 18) {
    throw malformed(nodelist, "bad range '" + item + "'");
  }
  long long value = 0;
  for (char c : bound) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      throw malformed(nodelist, "'" + item + "' in brackets is not a number or range");
    }
    value = value * 10 + (c - '0');
  }
  return value;
}

std::vector<Range> parse_group(const std::string& nodelist, const std::string& group) {
  std::vector<Range> ranges;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = group.find(',', start);
    std::string item = group.substr(start, comma == std::string::npos ? std::string::npos
                                                                      : comma - start);
    if (item.empty()) throw malformed(nodelist, "empty range in '[" + group + "]'");
    std::size_t dash = item.find('-');
    Range range;
    std::string lo = item.substr(0, dash);
    range.lo = parse_bound(nodelist, lo, item);
    range.hi = dash == std::string::npos ? range.lo
                                         : parse_bound(nodelist, item.substr(dash + 1), item);
    range.width = lo.size();
    if (range.lo > range.hi) {
      throw malformed(nodelist, "range '" + item + "' runs backwards (write " +
                                    std::to_string(range.hi) + "-" + std::to_string(range.lo) +
                                    ")");
    }
    ranges.push_back(range);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ranges;
}

Entry parse_entry(const std::string& nodelist, const std::string& text) {
  Entry entry;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t open = text.find('[', i);
    if (open != i) {
      entry.push_back({text.substr(i, open - i), {}});
      if (open == std::string::npos) break;
    }
    std::size_t close = text.find(']', open);  // split_entries guarantees one
    entry.push_back({"", parse_group(nodelist, text.substr(open + 1, close - open - 1))});
    i = close + 1;
  }
  return entry;
}

std::vector<Entry> parse_nodelist(const std::string& nodelist) {
  std::vector<Entry> entries;
  for (const auto& text : split_entries(nodelist)) entries.push_back(parse_entry(nodelist, text));
  return entries;
}

std::string format_number(long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

long long count_hosts(const Entry& entry) {
  long long count = 1;
  for (const auto& piece : entry) {
    if (piece.ranges.empty()) continue;
    long long in_group = 0;
    for (const auto& range : piece.ranges) in_group += range.hi - range.lo + 1;
    if (in_group > kMaxHosts || count * in_group > kMaxHosts) return kMaxHosts + 1;
    count *= in_group;
  }
  return count;
}

// Appends every host of `entry` from piece `index` on, after `prefix`.
void expand_entry(const Entry& entry, std::size_t index, const std::string& prefix,
                  std::vector<std::string>& hosts) {
  if (index == entry.size()) {
    hosts.push_back(prefix);
    return;
  }
  const Piece& piece = entry[index];
  if (piece.ranges.empty()) {
    expand_entry(entry, index + 1, prefix + piece.text, hosts);
    return;
  }
  for (const auto& range : piece.ranges) {
    for (long long value = range.lo; value <= range.hi; ++value) {
      expand_entry(entry, index + 1, prefix + format_number(value, range.width), hosts);
    }
  }
}

// Lightning's rule: the last 4 characters of the job id, read as a number, plus 15000.
int slurm_port_from_job_id(const std::string& job_id) {
  std::string tail = job_id.size() > 4 ? job_id.substr(job_id.size() - 4) : job_id;
  bool numeric = !tail.empty();
  for (char c : tail) numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
  if (!numeric) {
    throw EnvironmentError("SLURM_JOB_ID=" + job_id +
                           " does not end in digits, so no port can be derived from it. Set "
                           "MASTER_PORT to a free port, e.g. MASTER_PORT=29500.");
  }
  return 15000 + std::stoi(tail);
}

}  // namespace

namespace {

// The entries of `nodelist` and how many hosts they hold; more than kMaxHosts is an error.
std::vector<Entry> parse_and_count(const std::string& nodelist, long long& total) {
  auto entries = parse_nodelist(nodelist);
  total = 0;
  for (const auto& entry : entries) total += count_hosts(entry);
  if (total > kMaxHosts) {
    throw malformed(nodelist, "it expands to more than " + std::to_string(kMaxHosts) + " hosts");
  }
  return entries;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  long long total = 0;
  const auto entries = parse_and_count(nodelist, total);
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(total));
  for (const auto& entry : entries) expand_entry(entry, 0, "", hosts);
  return hosts;
}

std::string first_slurm_host(const std::string& nodelist) {
  long long total = 0;
  const auto entries = parse_and_count(nodelist, total);
  std::string host;
  for (const auto& piece : entries.front()) {
    host += piece.ranges.empty()
                ? piece.text
                : format_number(piece.ranges.front().lo, piece.ranges.front().width);
  }
  return host;
}

bool SLURMEnvironment::is_interactive(const Environ& env) {
  auto job_name = env.get("SLURM_JOB_NAME");
  return job_name && (*job_name == "bash" || *job_name == "interactive");
}

bool SLURMEnvironment::detect(const Environ& env) {
  return env.has("SLURM_NTASKS") && !is_interactive(env);
}

SLURMEnvironment::SLURMEnvironment(const Environ& env) {
  placement_.world_size = detail::require_int(env, "SLURM_NTASKS", kSetBySrun);
  placement_.global_rank = detail::require_int(env, "SLURM_PROCID", kSetBySrun);
  placement_.local_rank = detail::require_int(env, "SLURM_LOCALID", kSetBySrun);
  placement_.node_rank = detail::require_int(env, "SLURM_NODEID", kSetBySrun);
  detail::check_positive("SLURM_NTASKS", placement_.world_size);
  detail::check_rank_below("SLURM_PROCID", placement_.global_rank, "SLURM_NTASKS", placement_.world_size);
  nnodes_ = env.get_int("SLURM_NNODES");
  if (nnodes_) {
    detail::check_positive("SLURM_NNODES", *nnodes_);
    detail::check_rank_below("SLURM_NODEID", placement_.node_rank, "SLURM_NNODES", *nnodes_);
  }
  // A step may use fewer nodes than the allocation; the step's count is the one to compare.
  step_nnodes_ = env.get_int("SLURM_STEP_NUM_NODES");
  if (step_nnodes_) detail::check_positive("SLURM_STEP_NUM_NODES", *step_nnodes_);
  ntasks_per_node_ = env.get_int("SLURM_NTASKS_PER_NODE");
  placement_.local_world_size = ntasks_per_node_.value_or(0);
  if (ntasks_per_node_) {
    detail::check_positive("SLURM_NTASKS_PER_NODE", *ntasks_per_node_);
    detail::check_rank_below("SLURM_LOCALID", placement_.local_rank, "SLURM_NTASKS_PER_NODE",
                             *ntasks_per_node_);
  }

  std::optional<std::string> nodelist;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (!nodelist) nodelist = env.get(name);
  }
  if (auto address = env.get("MASTER_ADDR")) {
    placement_.main_address = *address;
  } else if (nodelist) {
    placement_.main_address = first_slurm_host(*nodelist);
  } else if (!nnodes_ || *nnodes_ == 1) {
    placement_.main_address = "127.0.0.1";
  } else {
    throw EnvironmentError("SLURM_NNODES=" + std::to_string(*nnodes_) +
                           " but no node list (SLURM_NODELIST) is set, so the host of rank 0 is "
                           "unknown. Start the program with srun, or set MASTER_ADDR.");
  }

  if (auto port = env.get("MASTER_PORT")) {
    placement_.main_port = detail::parse_port("MASTER_PORT", *port);
  } else if (auto job_id = env.get("SLURM_JOB_ID")) {
    placement_.main_port = slurm_port_from_job_id(*job_id);
  } else {
    placement_.main_port = 12910;  // Lightning's fallback when there is no job id
  }
}

void SLURMEnvironment::validate_settings(int devices, int num_nodes) const {
  if (ntasks_per_node_ && *ntasks_per_node_ != devices) {
    std::string per_node = std::to_string(*ntasks_per_node_);
    throw EnvironmentError("You set --devices=" + std::to_string(devices) +
                           " but SLURM_NTASKS_PER_NODE=" + per_node +
                           " (srun starts that many tasks per node). Use --devices " + per_node +
                           ", or srun --ntasks-per-node=" + std::to_string(devices) + ".");
  }
  auto nodes = step_nnodes_ ? step_nnodes_ : nnodes_;
  if (nodes && *nodes != num_nodes) {
    std::string count = std::to_string(*nodes);
    std::string variable = step_nnodes_ ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
    throw EnvironmentError("You set --num-nodes=" + std::to_string(num_nodes) +
                           " but the SLURM job runs on " + variable + "=" + count +
                           " nodes. Use --num-nodes " + count + ", or srun --nodes=" +
                           std::to_string(num_nodes) + ".");
  }
  if (placement_.world_size != devices * num_nodes) {
    throw EnvironmentError("You set --devices=" + std::to_string(devices) + " --num-nodes=" +
                           std::to_string(num_nodes) + " (" +
                           std::to_string(devices * num_nodes) +
                           " processes in all) but srun started SLURM_NTASKS=" +
                           std::to_string(placement_.world_size) + " tasks. Use srun --ntasks-per-node=" +
                           std::to_string(devices) + " --nodes=" + std::to_string(num_nodes) +
                           ", or --devices and --num-nodes whose product is " +
                           std::to_string(placement_.world_size) + ".");
  }
}

}  // namespace environments
}  // namespace lockstep
