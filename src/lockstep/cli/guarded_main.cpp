#include <lockstep/cli/guarded_main.h>

#include <iostream>

#include <c10/util/Exception.h>

#include <lockstep/core/usage_error.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/launch_error.h>
#include <lockstep/launchers/launcher.h>

namespace lockstep {
namespace cli {

namespace {

int run_guarded(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
  } catch (const environments::EnvironmentError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
  } catch (const launchers::LaunchError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
  } catch (const distributed::DistributedError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    return 1;
  }
  return 2;
}

}  // namespace

int guarded_main(const std::string& program, const std::function<int()>& body) {
  const int code = run_guarded(program, body);
  // Local rank 0 of a job it launched: its own failure ends the job now, with its code.
  return code == 0 ? 0 : launchers::end_launched_job(code);
}

}  // namespace cli
}  // namespace lockstep
