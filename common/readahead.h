// Library readahead for a cold page cache: a worker, once its first step is done, records which pages
// of its libraries it touched; the next launcher asks the kernel to read those pages before (and while)
// it spawns workers, so that the workers' page faults find them in memory instead of reading a
// scattered few KiB at a time from disk. No LibTorch, no gRPC.
#ifndef STAGEHAND_COMMON_READAHEAD_H_
#define STAGEHAND_COMMON_READAHEAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagehand {

struct ByteRange {
  int64_t offset = 0;
  int64_t length = 0;
  bool operator==(const ByteRange& o) const { return offset == o.offset && length == o.length; }
};

// One file of the list: what it was when recorded (a file whose size or mtime differs is skipped) and
// the ranges to read, sorted and disjoint.
struct FileRanges {
  std::string path;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  std::vector<ByteRange> ranges;
};

// The files in the order they are to be read (the order the worker's loader met them).
struct ReadaheadList {
  std::string key;  // ReadaheadKey of the worker binary that recorded it
  std::vector<FileRanges> files;
  int64_t total_bytes() const;
};

// Sorts `ranges` and merges those that overlap or lie within `gap` bytes of each other (a gap that
// small costs less to read than another request).
std::vector<ByteRange> MergeRanges(std::vector<ByteRange> ranges, int64_t gap);

// `fresh` with what `old` recorded of the same worker (its key) added: each file of `fresh` gets the
// union of both lists' ranges where `old` recorded the same size and mtime (merged within `gap`), and
// the files only `old` lists follow, in `old`'s order, those for which `keep_old_only` (when given)
// is true (the recorder keeps those still on disk as recorded, so a removed or rebuilt library leaves
// the list). So jobs of different models (or precisions, or attention kernels) from one worker binary
// each find their pages in the list, instead of the last job's alone. An `old` of another key is ignored.
ReadaheadList MergeReadaheadLists(const ReadaheadList& old, ReadaheadList fresh, int64_t gap,
                                  const std::function<bool(const FileRanges&)>& keep_old_only = nullptr);

// The list as text: "stagehand-readahead 1", "key KEY", then per file "file SIZE MTIME_NS PATH" and
// its "range OFFSET LENGTH" lines. Parse: INVALID_ARGUMENT naming the line for anything else.
std::string FormatReadaheadList(const ReadaheadList& list);
absl::StatusOr<ReadaheadList> ParseReadaheadList(const std::string& text);

// What a list must match: the worker binary's real path, size and mtime (a rebuilt worker links other
// libraries, or the same at other offsets). NOT_FOUND when the binary cannot be stat'ed.
absl::StatusOr<std::string> ReadaheadKey(const std::string& worker_binary);

// $XDG_CACHE_HOME/stagehand/readahead, else $HOME/.cache/stagehand/readahead; "" when neither is set.
std::string DefaultReadaheadDir();

// The list file of `key` in `dir`: one per worker binary.
std::string ReadaheadListPath(const std::string& dir, const std::string& key);

// The list in the file at `path`: NOT_FOUND when it cannot be opened (none written yet), else what
// ParseReadaheadList says of its text.
absl::StatusOr<ReadaheadList> ReadReadaheadList(const std::string& path);

// Writes `list` to `path` (the directory made if need be) through a temporary file and a rename, so a
// concurrent reader (another rank, the next launcher) sees the old list or the new one.
absl::Status WriteReadaheadList(const std::string& path, const ReadaheadList& list);

// The pages of this process's libraries (file-backed mappings of *.so* files, and the executable)
// that are mapped into it (/proc/self/pagemap), else, where pagemap cannot be read, resident in the
// page cache (mincore), as ranges merged within `gap`; the executable first, then the libraries by
// descending address (mmap places each later library below the earlier ones: the loader's order).
absl::StatusOr<ReadaheadList> TouchedLibraryPages(int64_t gap);

// What a readahead did.
struct ReadaheadStats {
  int files = 0;       // files asked for
  int skipped = 0;     // files missing or changed since the list was recorded
  int64_t bytes = 0;   // bytes asked for
  double seconds = 0;  // the posix_fadvise calls, start to end
  bool cancelled = false;
};

// Asks the kernel to read every range of every unchanged file of `list` (posix_fadvise WILLNEED), in
// the list's order, stopping early when `cancel` becomes true.
ReadaheadStats ReadAhead(const ReadaheadList& list, const std::atomic<bool>* cancel = nullptr);

// The files the launcher itself loads before it spawns workers (the CUDA driver and NVML, for its
// device query and health gate) moved to the front of `list`, keeping the order of the rest: read
// last, in the loader's order, they would queue behind the workers' libraries on the launcher's path.
void PutLauncherFilesFirst(ReadaheadList& list);

// The launcher's (and an agent's) readahead: Start reads the list of `worker_binary` from `dir` and
// reads ahead (PutLauncherFilesFirst) in a thread of its own, so that start-up never waits on it. A missing list, or
// one of another key, is silent; an unreadable or malformed one gives one warning line on stderr. Cancel stops it
// between ranges; the destructor cancels and joins.
class LibraryPrefetcher {
 public:
  LibraryPrefetcher() = default;
  LibraryPrefetcher(const LibraryPrefetcher&) = delete;
  LibraryPrefetcher& operator=(const LibraryPrefetcher&) = delete;
  ~LibraryPrefetcher();

  void Start(const std::string& dir, const std::string& worker_binary);
  void Cancel() { cancel_ = true; }
  // Waits for the thread; the stats of its readahead (empty when there was no list).
  ReadaheadStats Join();

 private:
  std::atomic<bool> cancel_{false};
  std::thread thread_;
  ReadaheadStats stats_;
};

// The worker's side: records this process's touched library pages for `worker_binary` (the running
// executable) into `dir`, added to what the list there already holds (MergeReadaheadLists, under an
// flock so that the ranks of a host merge one after another; a list that does not parse is replaced,
// and one that would grow past twice this job's pages starts again from them), in a thread of its own; the destructor
// joins it (a few ms), so no temporary file outlives the process.
class ReadaheadRecorder {
 public:
  ReadaheadRecorder() = default;
  ReadaheadRecorder(const ReadaheadRecorder&) = delete;
  ReadaheadRecorder& operator=(const ReadaheadRecorder&) = delete;
  ~ReadaheadRecorder();

  void Start(const std::string& dir);
  // Waits for the thread; what it wrote (a line for the log) or why not.
  absl::StatusOr<std::string> Join();

 private:
  std::thread thread_;
  absl::StatusOr<std::string> result_ = absl::FailedPreconditionError("not started");
};

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_READAHEAD_H_
