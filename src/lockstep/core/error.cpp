#include <lockstep/core/error.h>

#include <c10/util/Exception.h>

namespace lockstep {

std::string message_of(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) return torch_error->what_without_backtrace();
  return e.what();
}

}  // namespace lockstep
