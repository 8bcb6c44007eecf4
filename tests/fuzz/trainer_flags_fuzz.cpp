// The Trainer flags (cli/trainer_flags.h) on arbitrary command lines: input lines are the
// arguments. Parsing ends in options, help (exit 0) or one message with exit 2.
#include <lockstep/cli/trainer_flags.h>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  std::vector<std::string> args{"fuzz_trainer_flags"};
  std::istringstream lines(fuzz::text(data, size));
  for (std::string line; std::getline(lines, line);) args.push_back(line);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuzz::expect_only_lockstep_errors([&] {
    CLI::App app{"fuzz", "fuzz_trainer_flags"};
    TrainerOptions options;
    cli::add_trainer_flags(app, options);
    const int code = cli::parse_or_exit_code(app, static_cast<int>(argv.size()), argv.data());
    if (code != -1 && code != 0 && code != 2) std::abort();
  });
  return 0;
}
