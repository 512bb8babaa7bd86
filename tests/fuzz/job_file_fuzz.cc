// libFuzzer target for the job file: arbitrary bytes as a JobSpec text file through the launcher's
// reading and validation (ResolveJob: parse, defaults, the flags' overlay, every range, the model's
// sizes, the pipeline) and, for a job it accepts, the model job's checks (the schedule generated and
// simulated, the plan). A 4-GPU, 2-core machine with 8 GiB is assumed. Nothing may crash, hang or
// leak; an accepted job must have passed its own invariants (positive workers and steps).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "launcher/job/job.h"
#include "launcher/plan/job_plan.h"
#include "models/model_description.h"

namespace {

stagehand::DeviceInventory Machine() {
  stagehand::DeviceInventory inv;
  for (int i = 0; i < 4; ++i) {
    stagehand::GpuInfo g;
    g.ordinal = i;
    g.uuid = absl::StrCat("GPU-fuzz-", i);
    g.name = "fuzz GPU";
    g.total_bytes = int64_t{80} << 30;
    inv.gpus.push_back(g);
  }
  inv.cpu_cores = 2;
  inv.memory_bytes = int64_t{8} << 30;
  return inv;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "job_file_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // the parser logs what it refuses
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("job.textproto", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  stagehand::JobRequest request;
  request.job_file = absl::StrCat("/proc/self/fd/", fd);
  static const stagehand::DeviceInventory machine = Machine();
  absl::StatusOr<stagehand::ResolvedJob> job = stagehand::ResolveJob(request, machine);
  close(fd);
  if (!job.ok()) return 0;
  const stagehand::JobSpec& spec = job->spec;
  Check(spec.workers() >= 1 && spec.workers() <= 1024, "an accepted job has 1 to 1024 workers");
  Check(spec.steps() >= 1, "an accepted job runs at least one step");
  // The schedule's size is stages x micro-batches actions, and the simulator's time grows faster than
  // that (a 2 x 1000 1F1B list took over 10 s under ASan at -O1, 4 s for a whole optimized launch):
  // keep each input's work bounded so that the fuzzer explores rather than waits.
  if (stagehand::IsModelJob(spec) &&
      static_cast<int64_t>(spec.pipeline().stages()) * spec.pipeline().micro_batches() <= 256) {
    (void)stagehand::CheckModelJob(spec, job->gpus, machine.memory_bytes);
  }
  return 0;
}
