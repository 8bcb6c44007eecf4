#include <lockstep/cli/guarded_main.h>

#include <iostream>

#include <lockstep/core/error.h>
#include <lockstep/launchers/launcher.h>

namespace lockstep {
namespace cli {

namespace {

int run_guarded(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    if (e.report_here()) std::cerr << program << ": error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << message_of(e) << std::endl;
    return 1;
  }
}

}  // namespace

int guarded_main(const std::string& program, const std::function<int()>& body) {
  const int code = run_guarded(program, body);
  // Local rank 0 of a job it launched: its own failure ends the job now, with its code.
  return code == 0 ? 0 : launchers::end_launched_job(code);
}

}  // namespace cli
}  // namespace lockstep
