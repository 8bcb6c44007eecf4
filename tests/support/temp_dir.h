#pragma once
// A fresh folder under /tmp for one test, removed with everything in it at destruction (owner
// permissions are restored first, for tests that make a folder unwritable).

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace lockstep {
namespace testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "lockstep") {
    std::string pattern = "/tmp/" + prefix + "_XXXXXX";
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add,
                                 ignored);
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return *this / name; }

 private:
  std::string path_;
};

}  // namespace testing
}  // namespace lockstep
