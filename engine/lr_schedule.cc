// The learning-rate schedule (see lr_schedule.h).
#include "engine/lr_schedule.h"

#include <cmath>

namespace stagehand {

LrSchedule LrScheduleOf(const JobSpec& job) {
  LrSchedule s;
  s.lr = job.lr();
  s.min_lr = job.lr();
  const bool scheduled = job.has_warmup_steps() || job.has_lr_decay_steps() || job.has_min_lr();
  if (!scheduled) return s;
  s.min_lr = job.has_min_lr() ? job.min_lr() : job.lr() / 10;
  s.warmup_steps = job.warmup_steps();
  s.decay_steps = job.has_lr_decay_steps() ? job.lr_decay_steps() : job.steps();
  return s;
}

double LearningRate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps + 1);
  if (s.decay_steps <= s.warmup_steps) return s.min_lr;  // no decay: the floor (the lr, unscheduled)
  if (step > s.decay_steps) return s.min_lr;
  const double ratio = static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.decay_steps - s.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return s.min_lr + coeff * (s.lr - s.min_lr);
}

}  // namespace stagehand
