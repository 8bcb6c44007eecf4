#include "agent_store_round.h"

#include <unistd.h>

#include <functional>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include <lockstep/core/error.h>
#include <lockstep/core/libtorch_compat.h>

#include "rank_zero_probe.h"
#include "store_text.h"
#include "wait_for.h"

namespace lockstep {
namespace distributed {
namespace detail {
namespace {

std::string key(const char* what, int rank) {
  return std::string("lockstep/round/") + what + "/" + std::to_string(rank);
}

// The value at `name`, or "" while there is none.
std::string peek(c10d::Store& store, const std::string& name) {
  return store.check({name}) ? text_of(store.get(name)) : std::string();
}

// 64 random bits in hex: a word no earlier worker wrote.
std::string random_word() {
  std::random_device device;
  std::mt19937_64 bits((static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(::getpid()));
  char word[17];
  std::snprintf(word, sizeof(word), "%016llx", static_cast<unsigned long long>(bits()));
  return word;
}

// Rank 0: answers each rank's word with the round until every rank has taken it.
void lead(c10d::Store& store, int world_size, const std::string& round,
          std::chrono::steady_clock::time_point deadline, const std::string& fail) {
  std::vector<std::string> answered(world_size);
  std::vector<bool> joined(world_size, false);
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    std::string missing;
    for (int r = 1; r < world_size; ++r) {
      if (joined[r] || (joined[r] = peek(store, key("taken", r)) == round)) continue;
      const std::string word = peek(store, key("word", r));
      if (!word.empty() && word != answered[r]) {
        store.set(key("answer", r), bytes_of(word + " " + round));
        answered[r] = word;
        pause = std::chrono::milliseconds(1);
      }
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() > deadline) throw DistributedError(fail + "ranks " + missing + " never came.");
    std::this_thread::sleep_for(pause);
  }
}

// Any other rank: the round of rank 0's answer to this rank's word.
std::string follow(c10d::Store& store, int rank, const std::string& word,
                   std::chrono::steady_clock::time_point deadline, const std::string& fail) {
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    const std::string answer = peek(store, key("answer", rank));
    if (answer.rfind(word + " ", 0) == 0) {
      const std::string round = answer.substr(word.size() + 1);
      store.set(key("taken", rank), bytes_of(round));
      return round;
    }
    if (std::chrono::steady_clock::now() > deadline) throw DistributedError(fail + "rank 0 never answered.");
    std::this_thread::sleep_for(pause);
  }
}

// The answer to the first requests on a connection (`request` returns it, and must hold nothing
// of its caller's by reference), from a thread of its own that is left behind if the store does
// not answer within kRankZeroAnswers: LibTorch 1.x's client waits without end for an answer that
// PyTorch 2.x's store never gives, as it waits for its own protocol's greeting first. Throws
// DistributedError with `failed` of what went wrong.
std::string first_answer(const c10::intrusive_ptr<c10d::Store>& store,
                         const std::function<std::string(c10d::Store&)>& request,
                         const std::function<std::string(const std::string&)>& failed) {
  auto answer = std::make_shared<std::promise<std::pair<bool, std::string>>>();  // (answered, answer or error)
  auto answered = answer->get_future();
  std::thread([store, request, answer] {
    try {
      answer->set_value({true, request(*store)});
    } catch (const std::exception& e) {
      answer->set_value({false, message_of(e)});
    }
  }).detach();
  if (answered.wait_for(kRankZeroAnswers) != std::future_status::ready) {
    throw DistributedError(failed("gave no answer within " + seconds(kRankZeroAnswers)));
  }
  const auto [ok, text] = answered.get();
  if (!ok) throw DistributedError(failed("failed a request (" + text + ")"));
  return text;
}

}  // namespace

std::string agree_on_round(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           std::chrono::milliseconds timeout, const std::string& who, const std::string& endpoint) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string fail = who + ": the ranks did not meet in torchrun's store at " + endpoint + " within " +
                           seconds(timeout) + " (TORCHELASTIC_USE_AGENT_STORE=True): ";
  std::string fix = "Check that torchrun's agent is still running.";
  if (!libtorch::kSpeaksTorch2StoreProtocol) {
    fix = "PyTorch 2.x's torchrun shares its agent's store with the workers, and this build's LibTorch (1.x) "
          "does not speak that store's protocol: start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
          "(rank 0 then hosts the job's store), or use the torchrun of the torch this build has.";
  }
  const auto failed = [&](const std::string& what) {
    return who + ": torchrun's store at " + endpoint + " " + what + ". " + fix;
  };
  try {
    if (rank != 0) {
      const std::string word = random_word();
      // A set has no answer: the check after it has.
      first_answer(store, [word, rank](c10d::Store& s) {
        s.set(key("word", rank), bytes_of(word));
        return std::to_string(s.check({key("answer", rank)}));
      }, failed);
      return "lockstep/round_" + follow(*store, rank, word, deadline, fail);
    }
    const std::string round = first_answer(
        store, [](c10d::Store& s) { return std::to_string(s.add("lockstep/round/count", 1)); }, failed);
    if (world_size > 1) lead(*store, world_size, round, deadline, fail);
    return "lockstep/round_" + round;
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(failed("failed a request (" + message_of(e) + ")"));
  }
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
