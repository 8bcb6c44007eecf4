#include <lockstep/environments/cluster_environment.h>

#include <cctype>
#include <climits>
#include <fstream>
#include <sstream>

#include <lockstep/environments/kubeflow_environment.h>
#include <lockstep/environments/local_environment.h>
#include <lockstep/environments/lsf_environment.h>
#include <lockstep/environments/mpi_environment.h>
#include <lockstep/environments/slurm_environment.h>
#include <lockstep/environments/torchelastic_environment.h>

extern char** environ;

namespace lockstep {
namespace environments {
namespace {

// The variables torchrun sets in every worker; some but not all of them means a half-set job.
const char* const kTorchrunVariables[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
                                          "LOCAL_WORLD_SIZE"};

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

// Throws when some torchrun variables are set and others are not. Only called when no
// scheduler was detected, so the variables cannot belong to one.
void check_not_half_set(const Environ& env) {
  std::vector<std::string> set, missing;
  // Lightning's manual multi-node recipe: WORLD_SIZE with NODE_RANK, and this process starts its
  // node's ranks (LocalEnvironment).
  const bool manual_nodes = env.has("NODE_RANK") && env.has("WORLD_SIZE") && !env.has("RANK") &&
                            !env.has("LOCAL_RANK") && !env.has("GROUP_RANK") && !env.has("LOCAL_WORLD_SIZE");
  if (manual_nodes) return;
  for (const char* name : kTorchrunVariables) {
    if (auto value = env.get(name)) {
      set.push_back(std::string(name) + "=" + *value);
    } else {
      missing.push_back(name);
    }
  }
  if (set.empty()) return;
  std::ostringstream message;
  message << "Half-set torchrun environment: " << join(set, ", ") << " "
          << (set.size() == 1 ? "is" : "are") << " set but " << join(missing, ", ") << " "
          << (missing.size() == 1 ? "is" : "are") << " not. torchrun sets all of RANK, "
          << "LOCAL_RANK, WORLD_SIZE, GROUP_RANK and LOCAL_WORLD_SIZE. Launch with torchrun, "
          << "set " << join(missing, ", ") << " as well, or unset ";
  std::vector<std::string> set_names;
  for (const auto& item : set) set_names.push_back(item.substr(0, item.find('=')));
  message << join(set_names, ", ") << " to let Lockstep start the processes itself.";
  if (set.size() == 1 && env.has("WORLD_SIZE")) {
    message << " (To start each node yourself, as in Lightning, set NODE_RANK too, with MASTER_ADDR and "
            << "MASTER_PORT, and run the program once per node with --num-nodes N --devices "
            << "WORLD_SIZE/N.)";
  }
  if (env.has("KUBERNETES_PORT")) {
    std::vector<std::string> kubeflow_missing;
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) {
      if (!env.has(name)) kubeflow_missing.push_back(name);
    }
    message << " (In a Kubeflow PyTorchJob the operator sets MASTER_ADDR, MASTER_PORT, "
            << "WORLD_SIZE and RANK; here " << join(kubeflow_missing, ", ")
            << " did not reach the container: check the pod spec.)";
  }
  throw EnvironmentError(message.str());
}

// mpirun sets OMPI_COMM_WORLD_SIZE and Hydra's mpiexec MPI_LOCALNRANKS in every process it
// starts; srun sets neither (its direct launch sets PMI_RANK / PMIX_RANK). The answer is the
// same on every rank, which comparing per-rank numbers would not be: mpirun's own batch step
// has SLURM_PROCID=0, so rank 0 would agree with SLURM while the others would not.
bool started_by_mpi_launcher(const Environ& env) {
  return env.has("OMPI_COMM_WORLD_SIZE") || env.has("MPI_LOCALNRANKS");
}

// `env` prints a multi-line value (an exported shell function) over several lines; only a
// line that starts with a plausible name and '=' begins a new variable.
bool starts_variable(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '%') return false;
  }
  return true;
}

}  // namespace

Environ Environ::from_process() {
  std::map<std::string, std::string> vars;
  for (char** entry = ::environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string line(*entry);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    vars.emplace(line.substr(0, eq), line.substr(eq + 1));
  }
  return Environ(std::move(vars));
}

Environ Environ::from_env_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    throw EnvironmentError("Cannot read the recorded environment " + path +
                           ". Check the path; record one with `env > FILE`.");
  }
  std::map<std::string, std::string> vars;
  std::string line;
  std::string* last = nullptr;
  while (std::getline(file, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos && starts_variable(line.substr(0, eq))) {
      last = &(vars[line.substr(0, eq)] = line.substr(eq + 1));
    } else if (last != nullptr) {
      *last += "\n" + line;
    }
  }
  return Environ(std::move(vars));
}

std::optional<std::string> Environ::get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::optional<int> Environ::get_int(const std::string& name) const {
  auto value = get(name);
  if (!value) return std::nullopt;
  return detail::parse_non_negative(name, *value);
}

std::string ClusterEnvironment::describe() const {
  std::ostringstream out;
  out << name() << ": global rank " << global_rank() << " of " << world_size() << ", local rank "
      << local_rank() << ", node rank " << node_rank() << ", main " << main_address() << ":"
      << main_port();
  return out.str();
}

std::unique_ptr<ClusterEnvironment> detect_environment(const Environ& env) {
  if (TorchElasticEnvironment::detect(env)) return std::make_unique<TorchElasticEnvironment>(env);
  if (SLURMEnvironment::detect(env)) {
    if (MPIEnvironment::detect(env) && started_by_mpi_launcher(env)) {
      return std::make_unique<MPIEnvironment>(env);
    }
    return std::make_unique<SLURMEnvironment>(env);
  }
  if (LSFEnvironment::detect(env)) return std::make_unique<LSFEnvironment>(env);
  if (MPIEnvironment::detect(env)) return std::make_unique<MPIEnvironment>(env);
  if (KubeflowEnvironment::detect(env)) return std::make_unique<KubeflowEnvironment>(env);
  check_not_half_set(env);
  return std::make_unique<LocalEnvironment>(env);
}

namespace detail {

int parse_non_negative(const std::string& name, const std::string& value) {
  const std::string fix = " Set " + name + " to a whole number such as 0, or unset it.";
  if (value.empty()) throw EnvironmentError(name + " is set but empty." + fix);
  long long parsed = 0;
  for (char c : value) {
    if (c < '0' || c > '9') {
      throw EnvironmentError(name + "=" + value + " is not a non-negative integer." + fix);
    }
    parsed = parsed * 10 + (c - '0');
    if (parsed > INT_MAX) {
      throw EnvironmentError(name + "=" + value + " is too large (at most " +
                             std::to_string(INT_MAX) + ")." + fix);
    }
  }
  return static_cast<int>(parsed);
}

int parse_port(const std::string& name, const std::string& value) {
  const std::string fix = " Set " + name + " to a free TCP port between 1 and 65535, e.g. 29500.";
  int port = 0;
  try {
    port = parse_non_negative(name, value);
  } catch (const EnvironmentError&) {
    throw EnvironmentError(name + "=" + value + " is not a port number." + fix);
  }
  if (port < 1 || port > 65535) {
    throw EnvironmentError(name + "=" + value + " is outside 1..65535." + fix);
  }
  return port;
}

int require_int(const Environ& env, const std::string& name, const std::string& why_and_fix) {
  auto value = env.get_int(name);
  if (!value) throw EnvironmentError(name + " is not set: " + why_and_fix);
  return *value;
}

void check_rank_below(const std::string& rank_name, int rank, const std::string& size_name,
                      int size) {
  if (rank < size) return;
  throw EnvironmentError(rank_name + "=" + std::to_string(rank) + " is not below " + size_name +
                         "=" + std::to_string(size) + ": ranks count from 0 to " + size_name +
                         "-1. Check that both come from the same launch.");
}

void check_positive(const std::string& name, int size) {
  if (size >= 1) return;
  throw EnvironmentError(name + "=" + std::to_string(size) +
                         ": a job has at least one process. Set " + name +
                         " to the number of processes.");
}

}  // namespace detail
distributed::ProcessGroupOptions ClusterEnvironment::process_group_options() const {
  return distributed::ProcessGroupOptions(global_rank(), world_size())
      .main_address(main_address())
      .main_port(main_port())
      .use_agent_store(use_agent_store())
      .store_file(store_file());
}

}  // namespace environments
}  // namespace lockstep
