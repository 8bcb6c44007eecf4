#pragma once
/// The ClusterEnvironment interface: where this process sits in the job (ranks, main address).

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lockstep {
namespace environments {

/// A snapshot of environment variables. Production code reads the process's own
/// (`Environ::from_process()`); tests pass recorded fixtures.
class Environ {
 public:
  Environ() = default;
  explicit Environ(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  /// Every variable of the calling process, read once.
  static Environ from_process();

  std::optional<std::string> get(const std::string& name) const;
  bool has(const std::string& name) const { return vars_.count(name) > 0; }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

/// Thrown for a half-set or contradictory environment; `what()` says what was wrong,
/// what was given and how to fix it. Binaries turn it into exit code 2.
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where this process sits in a job and how to reach rank 0.
/// Every implementation also has `static bool detect(const Environ&)`.
class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  /// Short name: "local", "torchelastic", "slurm", "mpi", "lsf", "kubeflow".
  virtual std::string name() const = 0;
  /// True when a scheduler (torchrun, srun, mpirun, ...) started every process already,
  /// so Lockstep must not launch any.
  virtual bool creates_processes_externally() const = 0;
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int world_size() const = 0;
  virtual int global_rank() const = 0;
  virtual int local_rank() const = 0;
  virtual int node_rank() const = 0;
  /// Throws EnvironmentError when the trainer's devices/num_nodes contradict the scheduler.
  virtual void validate_settings(int devices, int num_nodes) const {}
};

/// The environment that applies, in the documented order: torchelastic, slurm, lsf, mpi,
/// kubeflow, then local. Throws EnvironmentError for a half-set environment.
std::unique_ptr<ClusterEnvironment> detect_environment(const Environ& env);

}  // namespace environments
}  // namespace lockstep
