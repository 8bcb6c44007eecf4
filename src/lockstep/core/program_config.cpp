#include <lockstep/core/program_config.h>

#include <mutex>

namespace lockstep {
namespace {

std::mutex program_config_mutex;
std::string program_config_text;  // guarded by program_config_mutex: set while parsing, read when fit starts

}  // namespace

void set_program_config(const std::string& yaml) {
  std::lock_guard<std::mutex> lock(program_config_mutex);
  program_config_text = yaml;
}

std::string program_config() {
  std::lock_guard<std::mutex> lock(program_config_mutex);
  return program_config_text;
}

}  // namespace lockstep
