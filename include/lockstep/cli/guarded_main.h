#pragma once
/// guarded_main: how every Lockstep binary ends. Bad input (UsageError, EnvironmentError,
/// LaunchError, a checkpoint that cannot be read) prints one "PROGRAM: error: ..." line and
/// returns 2; a distributed failure (a timeout, a dead peer) prints its message and returns 1.
/// A stop every rank agreed on (Ctrl-C, SIGTERM) is printed by rank 0 alone and returns 128 +
/// the signal. No stack trace, no abort.
///
///   int main(int argc, char** argv) {
///     return lockstep::cli::guarded_main("fashion_mnist", [&] { return run(argc, argv); });
///   }

#include <functional>
#include <string>

namespace lockstep {
namespace cli {

int guarded_main(const std::string& program, const std::function<int()>& body);

}  // namespace cli
}  // namespace lockstep
