// A C++ program for tests/program_cpp_test.sh, run by `launcher -- PROGRAM` as any program is: it
// reads torchrun's variables, reports --steps steps through stagehand/step.h (a loss that falls, the
// global batch's tokens and samples, and FLOPs), sleeping --step_ms in each, and writes
// "rank R of W: N steps" to stdout. With --hang_step S, rank 1 stops reporting at step S and sleeps.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "stagehand/step.h"

int main(int argc, char** argv) {
  int steps = 10, step_ms = 20, hang_step = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--steps") {
      steps = value;
    } else if (flag == "--step_ms") {
      step_ms = value;
    } else if (flag == "--hang_step") {
      hang_step = value;
    } else {
      std::fprintf(stderr, "cpp_steps: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const char* rank_env = std::getenv("RANK");
  const char* world_env = std::getenv("WORLD_SIZE");
  if (rank_env == nullptr || world_env == nullptr) {
    std::fprintf(stderr, "cpp_steps: RANK and WORLD_SIZE must be set (run it under the launcher)\n");
    return 2;
  }
  const int rank = std::atoi(rank_env), world = std::atoi(world_env);
  for (int s = 0; s < steps; ++s) {
    if (rank == 1 && s == hang_step) std::this_thread::sleep_for(std::chrono::hours(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    stagehand::StepInfo info;
    info.loss = 4.0 / (s + 1);
    info.tokens = 256 * world;
    info.samples = 4 * world;
    info.flops = 1e9 * world;
    stagehand::Step(info);
  }
  std::printf("rank %d of %d: %d steps\n", rank, world, steps);
  return 0;
}
