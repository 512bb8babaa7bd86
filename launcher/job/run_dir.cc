// The run directory's files (see run_dir.h).
#include "launcher/job/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

std::string Seconds(const std::optional<absl::Duration>& d) {
  return d ? absl::StrFormat("%.3f", absl::ToDoubleSeconds(*d)) : "-";
}

// The most specific code for a failed write: a full disk can be retried elsewhere, a permission
// cannot be fixed by retrying.
absl::Status WriteError(const std::string& path, int err) {
  const std::string message = absl::StrCat("cannot write ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(absl::StrCat(message, "; free space there or pass another --run_dir"));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(absl::StrCat(message, "; pass a --run_dir you can write in"));
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat(message, "; was the run directory removed?"));
    case EIO:
      return absl::DataLossError(absl::StrCat(message, "; the device reported an I/O error"));
    default:
      return absl::InternalError(message);
  }
}

// write(2) until done; EINTR is retried.
int WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    text.remove_prefix(n);
  }
  return 0;
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

// "rank12.log" with prefix "rank" and suffix ".log".
bool Numbered(absl::string_view name, absl::string_view prefix, absl::string_view suffix) {
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) return false;
  return AllDigits(name);
}

// What a run or sweep of ours writes in its directory (a worker's rank log and saved parameters, the
// reports, a sweep's tables and per-count directories, and the temporary names of WriteFileAtomically
// that a killed launcher may leave). --overwrite removes these and nothing else.
bool IsOurs(const std::string& name, bool is_dir) {
  if (is_dir) return Numbered(name, "workers_", "");
  static const char* const kFiles[] = {"job.textproto",      "job_id",    "steps.csv", "report.json", "trace.json",
                                       "startup_ledger.tsv", "sweep.csv", "sweep.md",  "sweep.svg"};
  for (const char* f : kFiles) {
    if (name == f || name == absl::StrCat(".", f, ".tmp")) return true;
  }
  return Numbered(name, "rank", ".log") || Numbered(name, "params_rank", ".pt") ||
         Numbered(name, "params_stage", ".pt");
}

struct Entry {
  std::string name;
  bool is_dir = false;
};

absl::Status ListDir(const std::string& path, std::vector<Entry>& out) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the run directory ", path, ": ", std::strerror(errno), "; pass another --run_dir"));
  }
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    const bool is_dir = lstat(absl::StrCat(path, "/", name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    out.push_back({name, is_dir});
  }
  closedir(d);
  return absl::OkStatus();
}

// The entries under `path` (recursively into our workers_<N>) that are not ours, as relative paths.
absl::Status ForeignEntries(const std::string& path, const std::string& prefix, std::vector<std::string>& out) {
  std::vector<Entry> entries;
  if (absl::Status s = ListDir(path, entries); !s.ok()) return s;
  for (const Entry& e : entries) {
    if (!IsOurs(e.name, e.is_dir)) {
      out.push_back(prefix + e.name);
    } else if (e.is_dir) {
      if (absl::Status s = ForeignEntries(absl::StrCat(path, "/", e.name), prefix + e.name + "/", out); !s.ok())
        return s;
    }
  }
  return absl::OkStatus();
}

// Removes what IsOurs names under `path`, depth first.
absl::Status RemoveOurs(const std::string& path) {
  std::vector<Entry> entries;
  if (absl::Status s = ListDir(path, entries); !s.ok()) return s;
  for (const Entry& e : entries) {
    if (!IsOurs(e.name, e.is_dir)) continue;
    const std::string child = absl::StrCat(path, "/", e.name);
    if (e.is_dir) {
      if (absl::Status s = RemoveOurs(child); !s.ok()) return s;
    }
    if ((e.is_dir ? rmdir(child.c_str()) : unlink(child.c_str())) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("--overwrite: cannot remove ", child, ": ", std::strerror(errno),
                                                      "; remove it yourself or pick another --run_dir"));
    }
  }
  return absl::OkStatus();
}

// Whether we can create a file in the directory: asked of the file system itself, since access(2)
// says yes to root on a read-only directory and knows nothing of read-only mounts.
int ProbeWritable(const std::string& dir) {
  const std::string probe = absl::StrCat(dir, "/.stagehand-probe-", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  close(fd);
  unlink(probe.c_str());
  return 0;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status CheckAbsent(const std::string& path) {
  // The nearest ancestor that exists is where mkdir -p will start.
  std::string ancestor = Parent(path);
  struct stat st;
  while (stat(ancestor.c_str(), &st) != 0 && ancestor != "/" && ancestor != ".") ancestor = Parent(ancestor);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run_dir=", path, ": ", ancestor, " is not a directory; pass a path under a directory"));
  }
  if (int err = ProbeWritable(ancestor); err != 0) {
    return absl::PermissionDeniedError(absl::StrCat("--run_dir=", path, ": cannot create it in ", ancestor, ": ",
                                                    std::strerror(err), "; pass a --run_dir you can write in"));
  }
  return absl::OkStatus();
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
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create the run directory ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRunDir(const std::string& path, bool overwrite) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return CheckAbsent(path);
    if (errno == ENOTDIR) {
      return absl::InvalidArgumentError(
          absl::StrCat("--run_dir=", path, ": part of the path is a file; pass a path under a directory"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("--run_dir=", path, ": ", std::strerror(errno), "; pass a --run_dir you can write in"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run_dir=", path, " is a file, not a directory; pass a new directory"));
  }
  if (int err = ProbeWritable(path); err != 0) {
    return absl::PermissionDeniedError(absl::StrCat("--run_dir=", path, ": cannot write in it: ", std::strerror(err),
                                                    "; pass a --run_dir you can write in"));
  }
  std::vector<Entry> entries;
  if (absl::Status s = ListDir(path, entries); !s.ok()) return s;
  if (entries.empty()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const Entry& e : entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  if (names.size() > 5) names.resize(5), names.push_back("...");
  if (!overwrite) {
    return absl::FailedPreconditionError(
        absl::StrCat("--run_dir=", path, " is not empty (", absl::StrJoin(names, ", "),
                     "); pass --overwrite to replace the run there, or a new directory"));
  }
  std::vector<std::string> foreign;
  if (absl::Status s = ForeignEntries(path, "", foreign); !s.ok()) return s;
  if (!foreign.empty()) {
    std::sort(foreign.begin(), foreign.end());
    if (foreign.size() > 5) foreign.resize(5), foreign.push_back("...");
    return absl::FailedPreconditionError(
        absl::StrCat("--run_dir=", path, " holds files a run of ours did not write (", absl::StrJoin(foreign, ", "),
                     "); --overwrite replaces only a run's files: remove them or pass a new directory"));
  }
  return absl::OkStatus();
}

absl::Status PrepareRunDir(const std::string& path, bool overwrite) {
  if (absl::Status s = MakeDirs(path); !s.ok()) return s;
  return overwrite ? RemoveOurs(path) : absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  // Named as IsOurs expects, so that --overwrite clears one a killed launcher left.
  const std::string tmp = absl::StrCat(dir, "/.", base, ".tmp");
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return WriteError(path, errno);
  int err = WriteAll(fd, contents);
  if (err == 0 && fsync(fd) != 0) err = errno;
  if (close(fd) != 0 && err == 0) err = errno;  // NFS reports a failed write-back here
  if (err == 0 && rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    unlink(tmp.c_str());
    return WriteError(path, err);
  }
  // The rename itself is durable once the directory is synced; a failure here leaves a whole file.
  if (const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

StepsCsv::~StepsCsv() {
  if (fd_ >= 0) close(fd_);
}

absl::Status StepsCsv::Open(const std::string& path, bool gpu_columns, bool eval_columns, bool incarnation_column) {
  path_ = path;
  gpu_columns_ = gpu_columns;
  eval_columns_ = eval_columns;
  incarnation_column_ = incarnation_column;
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return error_ = WriteError(path, errno);
  return Write(absl::StrCat("step,rank,loss,seconds,tokens,peak_memory_bytes", gpu_columns ? "," : "",
                            gpu_columns ? kGpuStepColumns : "", eval_columns ? ",val_loss,val_ppl" : "",
                            incarnation_column ? ",incarnation" : "", "\n"));
}

absl::Status StepsCsv::Write(absl::string_view text) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return error_ = absl::FailedPreconditionError(absl::StrCat(path_, ": not open"));
  if (int err = WriteAll(fd_, text); err != 0) {
    // Part of a row may have landed: cut back to the last whole one, so every row a reader finds is
    // a row we meant.
    if (ftruncate(fd_, size_) != 0 || lseek(fd_, size_, SEEK_SET) < 0) { /* the error below stands */
    }
    return error_ = WriteError(path_, err);
  }
  size_ += static_cast<off_t>(text.size());
  return absl::OkStatus();
}

absl::Status StepsCsv::Append(const std::vector<ReportStepRequest>& steps) {
  if (steps.empty()) return error_;
  std::string text;
  for (const ReportStepRequest& r : steps) text += StepsCsvRow(r, gpu_columns_, eval_columns_, incarnation_column_);
  return Write(text);
}

absl::Status StepsCsv::Close() {
  if (fd_ < 0) return error_;
  int err = fsync(fd_) != 0 ? errno : 0;
  if (close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0 && error_.ok()) error_ = WriteError(path_, err);
  return error_;
}

namespace {

std::string GpuCells(const ReportStepRequest& r) {
  if (!r.has_telemetry()) return std::string(12, ',');  // 13 empty cells
  const StepTelemetry& t = r.telemetry();
  return absl::StrFormat("%.0f,%.0f,%.0f,%.1f,%.1f,%.0f,%.0f,%s,%.0f,%.3f,%.3f,%.3f,%s", t.sm_mhz_mean(),
                         t.sm_mhz_min(), t.mem_mhz_mean(), t.power_w_mean(), t.power_w_max(), t.power_limit_w(),
                         t.temperature_c_max(),
                         t.has_fan_percent_max() ? absl::StrFormat("%.0f", t.fan_percent_max()) : "",
                         t.utilization_percent_mean(), t.power_capped_fraction(), t.thermal_fraction(),
                         t.throttled_fraction(), ThrottleNames(t.throttle_reasons_seen()));
}

}  // namespace

std::string StepsCsvRow(const ReportStepRequest& r, bool gpu_columns, bool eval_columns, bool incarnation_column) {
  std::string eval;
  if (eval_columns && r.has_val_loss()) {
    eval = absl::StrFormat(",%.9g,%.9g", r.val_loss(), std::exp(r.val_loss()));
  } else if (eval_columns) {
    eval = ",,";
  }
  return absl::StrCat(r.step(), ",", r.rank(), ",", r.has_loss() ? absl::StrFormat("%.9g", r.loss()) : "", ",",
                      absl::StrFormat("%.6f", r.step_seconds()), ",", r.tokens(), ",", r.peak_memory_bytes(),
                      gpu_columns ? "," : "", gpu_columns ? GpuCells(r) : "", eval,
                      incarnation_column ? absl::StrCat(",", r.incarnation()) : "", "\n");
}

absl::Status WriteLedger(const std::vector<RankLedger>& ledger, absl::Time launch, bool gpu, bool program,
                         const std::string& path) {
  auto gpu_only = [gpu](const std::optional<absl::Duration>& d) { return gpu ? Seconds(d) : std::string("n/a"); };
  std::string table = absl::StrCat("# launch_unix_micros=", absl::ToUnixMicros(launch), "\n");
  absl::StrAppend(&table, "rank\tspawned\tcuda_ready\tregistered\tnccl_ready\tfirst_step\n");
  for (const RankLedger& l : ledger) {
    absl::StrAppend(&table, l.rank, "\t", Seconds(l.spawned), "\t", gpu_only(l.cuda_ready), "\t", Seconds(l.registered),
                    "\t", gpu_only(l.nccl_ready), "\t", Seconds(l.first_step), "\n");
  }
  std::string out = "stagehand: startup ledger (seconds since launch)\n";
  if (program) {
    bool any_step = false;
    absl::StrAppend(&out, absl::StrFormat("  %4s %8s %10s\n", "rank", "spawned", "first_step"));
    for (const RankLedger& l : ledger) {
      any_step = any_step || l.first_step.has_value();
      absl::StrAppend(&out, absl::StrFormat("  %4d %8s %10s\n", l.rank, Seconds(l.spawned), Seconds(l.first_step)));
    }
    if (!any_step) absl::StrAppend(&out, "  (first_step: the program called no stagehand.step())\n");
    std::fputs(out.c_str(), stdout);
    return WriteFileAtomically(path, table);
  }
  if (gpu) {
    absl::StrAppend(&out, absl::StrFormat("  %4s %8s %10s %10s %10s %10s\n", "rank", "spawned", "cuda_ready",
                                          "registered", "nccl_ready", "first_step"));
  } else {
    absl::StrAppend(&out, absl::StrFormat("  %4s %8s %10s %10s\n", "rank", "spawned", "registered", "first_step"));
  }
  for (const RankLedger& l : ledger) {
    if (gpu) {
      absl::StrAppend(
          &out, absl::StrFormat("  %4d %8s %10s %10s %10s %10s\n", l.rank, Seconds(l.spawned), Seconds(l.cuda_ready),
                                Seconds(l.registered), Seconds(l.nccl_ready), Seconds(l.first_step)));
    } else {
      absl::StrAppend(&out, absl::StrFormat("  %4d %8s %10s %10s\n", l.rank, Seconds(l.spawned), Seconds(l.registered),
                                            Seconds(l.first_step)));
    }
  }
  std::fputs(out.c_str(), stdout);
  return WriteFileAtomically(path, table);
}

}  // namespace stagehand
