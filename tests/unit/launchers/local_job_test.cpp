// A job the in-process launcher starts on one machine, seen from outside while it trains: its
// ranks meet in a private file and Gloo binds to loopback, so no process of the job listens on a
// network interface (LibTorch 1.13's TCPStore listened on all of them).
#include <dirent.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process_support.h"

namespace lockstep {
namespace launchers {
namespace {

using namespace lockstep::testing;
using std::chrono::milliseconds;

// The socket inodes among `pid`'s open files.
std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* fds = ::opendir(dir.c_str());
  if (fds == nullptr) return inodes;
  while (const dirent* entry = ::readdir(fds)) {
    char target[128] = {0};
    const ssize_t n = ::readlink((dir + "/" + entry->d_name).c_str(), target, sizeof(target) - 1);
    const std::string link(target, n > 0 ? static_cast<size_t>(n) : 0);
    if (link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  ::closedir(fds);
  return inodes;
}

// 127.0.0.0/8, ::1 and ::ffff:127.x.y.z, in /proc/net/tcp's hex (32-bit words in host order).
bool is_loopback(const std::string& hex_address) {
  if (hex_address.size() == 8) return hex_address.substr(6, 2) == "7F";
  if (hex_address == "00000000000000000000000001000000") return true;
  return hex_address.substr(0, 24) == "0000000000000000FFFF0000" && hex_address.substr(30, 2) == "7F";
}

std::vector<std::string> store_folders(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("lockstep_store_", 0) == 0) out.push_back(entry.path().string());
  }
  return out;
}

struct Listener {
  std::string address;  // hex, as in /proc/net/tcp
  std::string inode;
};

std::vector<Listener> listeners() {
  std::vector<Listener> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A") out.push_back({local.substr(0, local.find(':')), inode});  // LISTEN
    }
  }
  return out;
}

TEST(LocalJob, ATwoRankJobOnOneMachineListensOnLoopbackOnly) {
  become_subreaper();
  TempDir dir;
  const auto process =
      start({program("trainer_program"), "--out", dir.path(), "--default-root-dir", dir.file("runs"), "--timeout",
             "60", "--devices", "2", "--strategy", "ddp", "--max-epochs", "1", "--pause-ms", "3000"},
            dir.file("stderr"), {{"OMP_NUM_THREADS", "1"}, {"TMPDIR", dir.path()}});
  ASSERT_TRUE(wait_for_files({dir.file("paused.0"), dir.file("paused.1")}, milliseconds(60000)))
      << process.stderr_text();
  const std::vector<pid_t> pids{process.pid, read_pid(dir.file("paused.1"))};
  // The rendezvous file, in a folder only this user can open.
  const auto folders = store_folders(dir.path());
  ASSERT_EQ(folders.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(folders[0] + "/store"));
  EXPECT_EQ(std::filesystem::status(folders[0]).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    const auto mine = socket_inodes(pid);
    inodes.insert(mine.begin(), mine.end());
  }
  EXPECT_FALSE(inodes.empty()) << "the ranks hold sockets (Gloo's): the test must see them";
  for (const auto& listener : listeners()) {
    if (!inodes.count(listener.inode)) continue;
    EXPECT_TRUE(is_loopback(listener.address)) << "a rank listens on " << listener.address << " (hex)";
  }
  EXPECT_EQ(wait_exit(process.pid, milliseconds(60000)), 0) << process.stderr_text();
  EXPECT_TRUE(all_gone_within(pids, milliseconds(2000)));
  EXPECT_TRUE(store_folders(dir.path()).empty()) << "the rendezvous folder outlived the job";
}

}  // namespace
}  // namespace launchers
}  // namespace lockstep
