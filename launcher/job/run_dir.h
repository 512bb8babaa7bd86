// The run directory and the files a run leaves in it, apart from the reports' contents (report.h):
// paths as the user typed them, the directory itself (new or empty unless --overwrite), files written
// whole or not at all (a temporary name, fsync, rename), steps.csv appended as steps arrive, and the
// startup ledger.
#ifndef STAGEHAND_LAUNCHER_JOB_RUN_DIR_H_
#define STAGEHAND_LAUNCHER_JOB_RUN_DIR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "launcher/supervise/supervisor.h"
#include "protos/coordinator.pb.h"

namespace stagehand {

// `bazel run` starts us in the runfiles tree; paths the user typed are relative to where they were
// (BUILD_WORKING_DIRECTORY). Absolute paths and "" are returned as they are.
std::string UserPath(const std::string& path);

// mkdir -p. INVALID_ARGUMENT naming the prefix that could not be made.
absl::Status MakeDirs(const std::string& path);

// Whether `path` can be this run's directory, without changing anything (so it is asked before
// anything is created or started): it is absent and its nearest existing ancestor is a directory we
// can write in, or it is a directory we can write in that is empty, or (with `overwrite`) that holds
// only what an earlier run of ours left there. INVALID_ARGUMENT for a file, PERMISSION_DENIED for a
// directory we cannot write in (read-only, no permission), FAILED_PRECONDITION for a directory that is
// not empty; each message says what to pass instead.
absl::Status CheckRunDir(const std::string& path, bool overwrite);

// Creates the run directory (mkdir -p) and, with `overwrite`, removes what an earlier run left in it,
// so that no stale rank log or report mixes with this run's. Call CheckRunDir first.
absl::Status PrepareRunDir(const std::string& path, bool overwrite);

// Writes `contents` to `path` so that `path` is either the whole new file or what it was before: the
// bytes go to a temporary name beside it, are fsync'd, then renamed over `path`, and the directory is
// fsync'd. On any failure the temporary file is removed and `path` is untouched. RESOURCE_EXHAUSTED
// for a full disk or quota, PERMISSION_DENIED for EACCES/EPERM/EROFS, DATA_LOSS for EIO, NOT_FOUND for a
// missing directory; the message names the path and the error.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// steps.csv: step, rank, loss (on the rank that computes it), seconds, tokens, peak memory, and for GPU
// runs with telemetry the GPU's columns (kGpuStepColumns: clocks, power, temperature, throttling, the
// step's mean and worst), then for jobs with a validation split val_loss and val_ppl (on the rank
// holding the last stage, after the steps it evaluated; empty elsewhere), then for jobs that may
// restart (--max_restarts) the worker's incarnation (1, 2, ...: a step a restart ran again appears
// once more, with the newer incarnation); one row per step report, appended (with write(2), no user-space buffer) as
// reports arrive, so a launcher killed with SIGKILL leaves every step reported so far. A row is whole or absent: a
// write that fails part-way is cut back to the last whole row. After a failure every call returns the same error.
class StepsCsv {
 public:
  StepsCsv() = default;
  ~StepsCsv();
  StepsCsv(const StepsCsv&) = delete;
  StepsCsv& operator=(const StepsCsv&) = delete;

  // Creates (truncates) the file and writes the header; `gpu_columns` adds the GPU telemetry columns
  // (a CPU run has none at all).
  // `eval_columns` adds val_loss and val_ppl, `incarnation_column` the incarnation (after the others).
  absl::Status Open(const std::string& path, bool gpu_columns = false, bool eval_columns = false,
                    bool incarnation_column = false);
  absl::Status Append(const std::vector<ReportStepRequest>& steps);
  // fsync and close; the file stays as written.
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  absl::Status Write(absl::string_view text);

  std::string path_;
  int fd_ = -1;
  off_t size_ = 0;  // bytes of whole rows (and the header) written
  bool gpu_columns_ = false;
  bool eval_columns_ = false;
  bool incarnation_column_ = false;
  absl::Status error_;
};

// The GPU telemetry columns of steps.csv, after the others: the step's mean and worst SM clock, mean
// memory clock, mean and highest power draw, the power limit, the highest temperature and fan speed
// (empty where the board has no fan), mean utilisation, the fractions of samples power-capped,
// thermally throttled and throttled for any reason, and the reasons seen ("sw_power_cap|hw_thermal").
inline constexpr char kGpuStepColumns[] =
    "sm_mhz_mean,sm_mhz_min,mem_mhz_mean,power_w_mean,power_w_max,power_limit_w,temperature_c_max,fan_percent_max,"
    "utilization_percent_mean,power_capped_fraction,thermal_fraction,throttled_fraction,throttle_reasons";

// One steps.csv row (with its newline); `gpu_columns` as the file was opened (empty cells for a report
// without telemetry).
std::string StepsCsvRow(const ReportStepRequest& r, bool gpu_columns = false, bool eval_columns = false,
                        bool incarnation_column = false);

// startup_ledger.tsv at `path` (seconds from launch to each milestone, per rank), written atomically,
// and the same table printed on stdout. `gpu`: a CPU run has no CUDA context and no NCCL communicator,
// so the file says n/a in those columns and the printed table leaves them out. `program`: the ranks of
// `launcher -- PROGRAM` neither register nor report CUDA or NCCL, so the printed table has the spawn and
// the first `stagehand.step()` the launcher read (the file keeps every column).
absl::Status WriteLedger(const std::vector<RankLedger>& ledger, absl::Time launch, bool gpu, bool program,
                         const std::string& path);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_RUN_DIR_H_
