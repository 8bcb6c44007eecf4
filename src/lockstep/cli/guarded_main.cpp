#include <lockstep/cli/guarded_main.h>

#include <iostream>

#include <c10/util/Exception.h>

#include <lockstep/core/usage_error.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/launch_error.h>

namespace lockstep {
namespace cli {

int guarded_main(const std::string& program, const std::function<int()>& body) {
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

}  // namespace cli
}  // namespace lockstep
