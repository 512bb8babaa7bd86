// The learning rate of each step, as nanoGPT and Megatron-LM schedule it: a linear warm-up, then a
// cosine decay to a floor. No LibTorch.
#ifndef STAGEHAND_ENGINE_LR_SCHEDULE_H_
#define STAGEHAND_ENGINE_LR_SCHEDULE_H_

#include <cstdint>

#include "protos/job.pb.h"

namespace stagehand {

struct LrSchedule {
  double lr = 1e-4;          // the peak
  double min_lr = 1e-4;      // the floor the cosine reaches at decay_steps
  int64_t warmup_steps = 0;  // steps 0 .. warmup_steps-1 climb as lr * (step + 1) / (warmup_steps + 1)
  int64_t decay_steps = 0;   // the step the cosine ends at; min_lr after it
};

// The job's schedule: constant --lr unless --warmup_steps, --lr_decay_steps or --min_lr is set; then
// the decay ends at --lr_decay_steps (default: the run's steps) at --min_lr (default --lr / 10).
LrSchedule LrScheduleOf(const JobSpec& job);

// nanoGPT's get_lr(it).
double LearningRate(const LrSchedule& s, int64_t step);

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_LR_SCHEDULE_H_
