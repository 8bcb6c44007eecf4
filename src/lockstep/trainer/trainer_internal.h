#pragma once
// What trainer.cpp, loops.cpp and checkpointing.cpp share: the Trainer's own helpers, not installed.

#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/trainer/trainer.h>

namespace lockstep {

template <typename Fn>
void Trainer::each_callback(const char* hook, Fn&& fn) {
  for (auto& callback : callbacks_) {
    if (!profiler_) {
      fn(*callback);
      continue;
    }
    auto timed = profile("[Callback]" + callback->name() + "." + hook);
    fn(*callback);
  }
}

}  // namespace lockstep
