#include <lockstep/loggers/logger.h>

#include <filesystem>

namespace lockstep {
namespace loggers {

std::string Logger::log_dir() const {
  std::filesystem::path dir(save_dir());
  if (!name().empty()) dir /= name();
  return (dir / version()).string();
}

}  // namespace loggers
}  // namespace lockstep
