// The run directory and the files a run leaves in it, apart from the reports (report.h): paths as
// the user typed them, the directory itself, the startup ledger and steps.csv.
#ifndef STAGEHAND_LAUNCHER_RUN_DIR_H_
#define STAGEHAND_LAUNCHER_RUN_DIR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "launcher/supervisor.h"
#include "protos/coordinator.pb.h"

namespace stagehand {

// `bazel run` starts us in the runfiles tree; paths the user typed are relative to where they were
// (BUILD_WORKING_DIRECTORY). Absolute paths and "" are returned as they are.
std::string UserPath(const std::string& path);

// mkdir -p. INVALID_ARGUMENT naming the prefix that could not be made.
absl::Status MakeDirs(const std::string& path);

// startup_ledger.tsv at `path` (seconds from launch to each milestone, per rank), and the same table
// printed on stdout.
void WriteLedger(const std::vector<RankLedger>& ledger, absl::Time launch, const std::string& path);

// steps.csv: step, rank, loss (on the rank that computes it), seconds, tokens, peak memory.
void WriteSteps(const std::vector<ReportStepRequest>& steps, const std::string& path);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_DIR_H_
