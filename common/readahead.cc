// Library readahead (see readahead.h).
#include "common/readahead.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cache_dir.h"
#include "common/input_file.h"
#include "common/fd.h"

namespace stagehand {
namespace {

constexpr char kMagic[] = "stagehand-readahead 1";
constexpr char kKeyVersion[] = "readahead-v1";
// The page size pagemap and mincore count in (4 KiB on x86-64, 64 KiB on some aarch64 kernels).
const int64_t kPage = [] {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<int64_t>(page) : int64_t{4096};
}();

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

int64_t MtimeNs(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string prefix = dir.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", prefix, ": ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Whether a mapped file is one to read ahead: a shared library (a "*.so*" basename) or the executable.
bool IsLibrary(const std::string& path, const std::string& exe) {
  if (path == exe) return true;
  const size_t slash = path.rfind('/');
  // ".so" ending the name or followed by a '.' (libfoo.so, libfoo.so.12), not "x.sorted.bin".
  for (size_t at = path.find(".so", slash == std::string::npos ? 0 : slash); at != std::string::npos;
       at = path.find(".so", at + 1)) {
    if (at + 3 == path.size() || path[at + 3] == '.') return true;
  }
  return false;
}

// One file-backed mapping of /proc/self/maps.
struct Mapping {
  uint64_t start = 0, end = 0;
  int64_t offset = 0;
  std::string path;
};

std::vector<Mapping> FileMappings() {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode;
    if (!(in >> range >> perms >> offset >> dev >> inode)) continue;
    std::string path;
    std::getline(in, path);
    path = std::string(absl::StripLeadingAsciiWhitespace(path));
    if (path.empty() || path[0] != '/' || inode == "0" || absl::EndsWith(path, " (deleted)")) continue;
    std::vector<std::string> se = absl::StrSplit(range, '-');
    Mapping m;
    if (se.size() != 2 || !absl::SimpleHexAtoi(se[0], &m.start) || !absl::SimpleHexAtoi(se[1], &m.end)) continue;
    uint64_t off = 0;
    if (!absl::SimpleHexAtoi(offset, &off)) continue;
    m.offset = static_cast<int64_t>(off);
    m.path = std::move(path);
    out.push_back(std::move(m));
  }
  return out;
}

// Per page of `m`: mapped into this process (pagemap's present bit), or, where pagemap cannot be read,
// resident in the page cache (mincore: on a warm host about 4x the pages the worker touched).
std::vector<bool> PresentPages(const Mapping& m, int pagemap) {
  const size_t pages = (m.end - m.start) / kPage;
  std::vector<bool> present(pages, false);
  std::vector<uint64_t> entries(pages, 0);
  const ssize_t want = static_cast<ssize_t>(pages * sizeof(uint64_t));
  if (pagemap >= 0 && pread(pagemap, entries.data(), want, (m.start / kPage) * sizeof(uint64_t)) == want) {
    for (size_t i = 0; i < pages; ++i) present[i] = (entries[i] >> 63) & 1;
    return present;
  }
  std::vector<unsigned char> in_core(pages, 0);
  if (mincore(reinterpret_cast<void*>(m.start), m.end - m.start, in_core.data()) == 0) {
    for (size_t i = 0; i < pages; ++i) present[i] = in_core[i] & 1;
  }
  return present;
}

}  // namespace

int64_t ReadaheadList::total_bytes() const {
  int64_t total = 0;
  for (const FileRanges& f : files) {
    for (const ByteRange& r : f.ranges) total += r.length;
  }
  return total;
}

std::vector<ByteRange> MergeRanges(std::vector<ByteRange> ranges, int64_t gap) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> out;
  for (const ByteRange& r : ranges) {
    if (r.length <= 0) continue;
    if (!out.empty() && r.offset <= out.back().offset + out.back().length + gap) {
      ByteRange& last = out.back();
      last.length = std::max(last.offset + last.length, r.offset + r.length) - last.offset;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::string FormatReadaheadList(const ReadaheadList& list) {
  std::string out = absl::StrCat(kMagic, "\nkey ", list.key, "\n");
  for (const FileRanges& f : list.files) {
    absl::StrAppend(&out, "file ", f.size, " ", f.mtime_ns, " ", f.path, "\n");
    for (const ByteRange& r : f.ranges) absl::StrAppend(&out, "range ", r.offset, " ", r.length, "\n");
  }
  return out;
}

absl::StatusOr<ReadaheadList> ParseReadaheadList(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty() || lines[0] != kMagic) return LineError(1, absl::StrCat("expected \"", kMagic, "\""));
  if (lines.size() < 2 || !absl::StartsWith(lines[1], "key ")) return LineError(2, "expected \"key KEY\"");
  ReadaheadList list;
  list.key = lines[1].substr(4);
  for (size_t i = 2; i < lines.size(); ++i) {
    const int n = static_cast<int>(i) + 1;
    std::vector<std::string> f = absl::StrSplit(lines[i], absl::MaxSplits(' ', 3));
    if (f[0] == "file") {
      FileRanges file;
      if (f.size() != 4 || !absl::SimpleAtoi(f[1], &file.size) || !absl::SimpleAtoi(f[2], &file.mtime_ns) ||
          file.size < 0 || f[3].empty() || f[3][0] != '/') {
        return LineError(n, "expected \"file SIZE MTIME_NS /PATH\"");
      }
      file.path = f[3];
      list.files.push_back(std::move(file));
    } else if (f[0] == "range") {
      ByteRange r;
      if (list.files.empty()) return LineError(n, "a range before any file");
      if (f.size() != 3 || !absl::SimpleAtoi(f[1], &r.offset) || !absl::SimpleAtoi(f[2], &r.length) || r.offset < 0 ||
          r.length <= 0 || r.offset > list.files.back().size - r.length) {
        return LineError(n, "expected \"range OFFSET LENGTH\" inside the file");
      }
      list.files.back().ranges.push_back(r);
    } else {
      return LineError(n, absl::StrCat("unknown line \"", lines[i].substr(0, 40), "\""));
    }
  }
  return list;
}

absl::StatusOr<std::string> ReadaheadKey(const std::string& worker_binary) {
  char real[PATH_MAX];
  if (realpath(worker_binary.c_str(), real) == nullptr) {
    return absl::NotFoundError(absl::StrCat(worker_binary, ": ", ErrnoText(errno)));
  }
  struct stat st;
  if (stat(real, &st) != 0) return absl::NotFoundError(absl::StrCat(real, ": ", ErrnoText(errno)));
  return absl::StrCat(kKeyVersion, " worker=", real, " size=", st.st_size, " mtime_ns=", MtimeNs(st));
}

std::string DefaultReadaheadDir() { return StagehandCacheDir("readahead"); }

std::string ReadaheadListPath(const std::string& dir, const std::string& key) {
  return absl::StrFormat("%s/%016x.list", dir, Fnv1a(key));
}

absl::StatusOr<ReadaheadList> ReadReadaheadList(const std::string& path) {
  // A regular file only (input_file.h): a FIFO in the cache must not hang the prefetcher.
  absl::StatusOr<std::string> text = ReadRegularFile(path, path, int64_t{64} << 20);
  if (!text.ok())
    return absl::NotFoundError(absl::StrCat("no readahead list at ", path, " (", text.status().message(), ")"));
  return ParseReadaheadList(*text);
}

absl::Status WriteReadaheadList(const std::string& path, const ReadaheadList& list) {
  if (absl::Status s = MakeDirs(Dirname(path)); !s.ok()) return s;
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const std::string text = FormatReadaheadList(list);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("writing ", tmp, " failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = ErrnoText(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("rename ", tmp, " to ", path, ": ", error));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadaheadList> TouchedLibraryPages(int64_t gap) {
  char exe_buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
  if (n <= 0) return absl::InternalError(absl::StrCat("readlink /proc/self/exe: ", ErrnoText(errno)));
  const std::string exe(exe_buf, n);
  absl::StatusOr<std::string> key = ReadaheadKey(exe);
  if (!key.ok()) return key.status();
  UniqueFd pagemap(open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  struct Found {
    FileRanges file;
    uint64_t lowest = UINT64_MAX;
    std::vector<ByteRange> pages;
  };
  std::map<std::string, Found> by_path;
  for (const Mapping& m : FileMappings()) {
    if (!IsLibrary(m.path, exe)) continue;
    Found& f = by_path[m.path];
    f.lowest = std::min(f.lowest, m.start);
    const std::vector<bool> present = PresentPages(m, pagemap.get());
    for (size_t i = 0; i < present.size(); ++i) {
      if (present[i]) f.pages.push_back({m.offset + static_cast<int64_t>(i) * kPage, kPage});
    }
  }
  std::vector<Found*> order;
  for (auto& [path, f] : by_path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || path.find('\n') != std::string::npos) continue;
    f.file = {path, st.st_size, MtimeNs(st), MergeRanges(std::move(f.pages), gap)};
    for (ByteRange& r : f.file.ranges) r.length = std::min(r.length, f.file.size - r.offset);  // the last page
    f.file.ranges.erase(
        std::remove_if(f.file.ranges.begin(), f.file.ranges.end(), [](const ByteRange& r) { return r.length <= 0; }),
        f.file.ranges.end());
    if (!f.file.ranges.empty()) order.push_back(&f);
  }
  std::sort(order.begin(), order.end(), [&exe](const Found* a, const Found* b) {
    if ((a->file.path == exe) != (b->file.path == exe)) return a->file.path == exe;
    return a->lowest > b->lowest;
  });
  ReadaheadList list;
  list.key = *key;
  for (Found* f : order) list.files.push_back(std::move(f->file));
  return list;
}

ReadaheadStats ReadAhead(const ReadaheadList& list, const std::atomic<bool>* cancel) {
  ReadaheadStats stats;
  const auto start = std::chrono::steady_clock::now();
  for (const FileRanges& f : list.files) {
    if (cancel != nullptr && cancel->load()) {
      stats.cancelled = true;
      break;
    }
    struct stat st;
    // O_NONBLOCK: a FIFO (or another special file) put where a library was must not block the thread.
    UniqueFd fd(open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != f.size ||
        MtimeNs(st) != f.mtime_ns) {
      ++stats.skipped;
      continue;
    }
    ++stats.files;
    for (const ByteRange& r : f.ranges) {
      if (cancel != nullptr && cancel->load()) break;
      posix_fadvise(fd.get(), r.offset, r.length, POSIX_FADV_WILLNEED);
      stats.bytes += r.length;
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

namespace {

// The recorder's merge gap: ranges closer than this are read as one (cheaper than another request).
constexpr int64_t kRecordGap = 64 * 1024;

// Whether `f` is on disk as recorded: a regular file of its size and mtime.
bool StillAsRecorded(const FileRanges& f) {
  struct stat st;
  return stat(f.path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == f.size && MtimeNs(st) == f.mtime_ns;
}

}  // namespace

ReadaheadList MergeReadaheadLists(const ReadaheadList& old, ReadaheadList fresh, int64_t gap,
                                  const std::function<bool(const FileRanges&)>& keep_old_only) {
  if (old.key != fresh.key) return fresh;
  std::map<std::string, const FileRanges*> old_files;
  for (const FileRanges& f : old.files) old_files.emplace(f.path, &f);
  std::set<std::string> fresh_paths;
  for (FileRanges& f : fresh.files) {
    fresh_paths.insert(f.path);
    auto it = old_files.find(f.path);
    if (it == old_files.end() || it->second->size != f.size || it->second->mtime_ns != f.mtime_ns) continue;
    std::vector<ByteRange> both = f.ranges;
    both.insert(both.end(), it->second->ranges.begin(), it->second->ranges.end());
    f.ranges = MergeRanges(std::move(both), gap);
  }
  for (const FileRanges& f : old.files) {
    if (fresh_paths.count(f.path) == 0 && (!keep_old_only || keep_old_only(f))) fresh.files.push_back(f);
  }
  return fresh;
}

void PutLauncherFilesFirst(ReadaheadList& list) {
  auto launchers = [](const FileRanges& f) {
    const size_t slash = f.path.rfind('/');
    const absl::string_view base = absl::string_view(f.path).substr(slash == std::string::npos ? 0 : slash + 1);
    return absl::StartsWith(base, "libcuda.so") || absl::StartsWith(base, "libnvidia-ml.so");
  };
  std::stable_partition(list.files.begin(), list.files.end(), launchers);
}

LibraryPrefetcher::~LibraryPrefetcher() {
  Cancel();
  Join();
}

void LibraryPrefetcher::Start(const std::string& dir, const std::string& worker_binary) {
  if (thread_.joinable() || dir.empty()) return;
  thread_ = std::thread([this, dir, worker_binary] {
    absl::StatusOr<std::string> key = ReadaheadKey(worker_binary);
    if (!key.ok()) return;  // the launch's own check says what is wrong with the worker
    const std::string path = ReadaheadListPath(dir, *key);
    absl::StatusOr<ReadaheadList> list = ReadReadaheadList(path);
    if (absl::IsNotFound(list.status())) return;  // none yet: the first run records it
    if (!list.ok()) {
      std::fprintf(stderr,
                   "stagehand: warning: ignoring the library readahead list %s (%s); the next run rewrites "
                   "it (--prefetch_libraries=false turns this off)\n",
                   path.c_str(), std::string(list.status().message()).c_str());
      return;
    }
    if (list->key != *key) return;  // another worker's (a hash collision): not ours to use
    PutLauncherFilesFirst(*list);
    stats_ = ReadAhead(*list, &cancel_);
  });
}

ReadaheadStats LibraryPrefetcher::Join() {
  if (thread_.joinable()) thread_.join();
  return stats_;
}

ReadaheadRecorder::~ReadaheadRecorder() {
  if (thread_.joinable()) thread_.join();
}

void ReadaheadRecorder::Start(const std::string& dir) {
  if (thread_.joinable()) return;
  if (dir.empty()) {
    result_ = absl::FailedPreconditionError("no cache directory: neither XDG_CACHE_HOME nor HOME is set");
    return;
  }
  thread_ = std::thread([this, dir] {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ReadaheadList> list = TouchedLibraryPages(kRecordGap);
    if (!list.ok()) {
      result_ = list.status();
      return;
    }
    const std::string path = ReadaheadListPath(dir, list->key);
    // Every rank of a host records: one at a time reads, merges and renames (an flock on a hidden lock
    // file beside the list, .NAME.lock, released when it is closed), so that no rank's pages are lost to
    // another's rename.
    UniqueFd lock;
    if (MakeDirs(Dirname(path)).ok()) {
      const std::string lock_path = absl::StrCat(Dirname(path), "/.", path.substr(path.rfind('/') + 1), ".lock");
      lock = UniqueFd(open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
      if (lock.valid()) flock(lock.get(), LOCK_EX);
    }
    const int64_t touched = list->total_bytes();
    const int files_touched = static_cast<int>(list->files.size());
    std::string history;  // what the line says of earlier jobs' pages
    // What earlier jobs of this worker recorded stays in the list.
    if (absl::StatusOr<ReadaheadList> old = ReadReadaheadList(path); old.ok() && old->key == list->key) {
      ReadaheadList merged = MergeReadaheadLists(*old, *list, kRecordGap, StillAsRecorded);
      // Bounded: the union of a few models' jobs is a few percent more than one job's; a list that
      // would read more than twice what this job touched starts again from this job's pages.
      if (merged.total_bytes() <= 2 * touched) {
        if (merged.total_bytes() > touched) {
          history = absl::StrFormat("; %.1f MiB and %d files more from earlier jobs",
                                    (merged.total_bytes() - touched) / 1048576.0,
                                    static_cast<int>(merged.files.size()) - files_touched);
        }
        *list = std::move(merged);
      } else {
        history =
            absl::StrFormat("; earlier jobs' pages dropped (%.1f MiB with them)", merged.total_bytes() / 1048576.0);
      }
    }
    if (absl::Status s = WriteReadaheadList(path, *list); !s.ok()) {
      result_ = s;
      return;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    result_ = absl::StrFormat(
        "library readahead list: %d files, %.1f MiB (this job touched %.1f MiB%s), written in "
        "%.1f ms to %s",
        static_cast<int>(list->files.size()), list->total_bytes() / 1048576.0, touched / 1048576.0, history, ms, path);
  });
}

absl::StatusOr<std::string> ReadaheadRecorder::Join() {
  if (thread_.joinable()) thread_.join();
  return result_;
}

}  // namespace stagehand
