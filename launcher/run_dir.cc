// The run directory's files (see run_dir.h).
#include "launcher/run_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagehand {
namespace {

std::string Seconds(const std::optional<absl::Duration>& d) {
  return d ? absl::StrFormat("%.3f", absl::ToDoubleSeconds(*d)) : "-";
}

}  // namespace

std::string UserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  return wd ? absl::StrCat(wd, "/", path) : path;
}

absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(absl::StrCat("cannot create the run directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

void WriteLedger(const std::vector<RankLedger>& ledger, absl::Time launch, const std::string& path) {
  std::string table = absl::StrCat("# launch_unix_micros=", absl::ToUnixMicros(launch), "\n");
  absl::StrAppend(&table, "rank\tspawned\tcuda_ready\tregistered\tnccl_ready\tfirst_step\n");
  for (const RankLedger& l : ledger) {
    absl::StrAppend(&table, l.rank, "\t", Seconds(l.spawned), "\t", Seconds(l.cuda_ready), "\t",
                    Seconds(l.registered), "\t", Seconds(l.nccl_ready), "\t", Seconds(l.first_step), "\n");
  }
  std::ofstream(path) << table;
  std::string out = "stagehand: startup ledger (seconds since launch)\n";
  absl::StrAppend(&out, absl::StrFormat("  %4s %8s %10s %10s %10s %10s\n", "rank", "spawned", "cuda_ready", "registered",
                                        "nccl_ready", "first_step"));
  for (const RankLedger& l : ledger) {
    absl::StrAppend(&out, absl::StrFormat("  %4d %8s %10s %10s %10s %10s\n", l.rank, Seconds(l.spawned),
                                          Seconds(l.cuda_ready), Seconds(l.registered), Seconds(l.nccl_ready),
                                          Seconds(l.first_step)));
  }
  std::fputs(out.c_str(), stdout);
}

void WriteSteps(const std::vector<ReportStepRequest>& steps, const std::string& path) {
  std::string csv = "step,rank,loss,seconds,tokens,peak_memory_bytes\n";
  for (const ReportStepRequest& r : steps) {
    absl::StrAppend(&csv, r.step(), ",", r.rank(), ",", r.has_loss() ? absl::StrFormat("%.9g", r.loss()) : "", ",",
                    absl::StrFormat("%.6f", r.step_seconds()), ",", r.tokens(), ",", r.peak_memory_bytes(), "\n");
  }
  std::ofstream(path) << csv;
}

}  // namespace stagehand
