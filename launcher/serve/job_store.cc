// The job store over SQLite (see job_store.h).
//
// Durability: journal_mode=WAL with synchronous=FULL. WAL alone (any synchronous setting) already
// survives a kill -9 of the server: a commit is in the -wal file, in the kernel's page cache, before
// sqlite3_step returns, and a torn last frame fails its checksum and is ignored on the next open.
// FULL adds an fsync of the WAL at every commit, so that a submit the client was told about survives a
// power cut or a kernel crash too; NORMAL could lose the last commits there. A job server commits a
// few times per job, so the fsync (about a millisecond on an SSD) costs nothing that matters.
#include "launcher/serve/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crypto.h"
#include "common/fd.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace stagehand {
namespace {

// "STGH": PRAGMA application_id, which tells our database from another program's SQLite file.
constexpr int32_t kApplicationId = 0x53544748;
// PRAGMA user_version: the schema below. A change adds a migration from the previous version in Init.
constexpr int64_t kSchemaVersion = 2;  // 2: tokens.revoked_us (revoked tokens are kept, their names never reused)
// How long a statement waits for a lock held by another connection (an sqlite3 shell reading the file).
constexpr int kBusyTimeoutMs = 5000;

constexpr char kSchema[] = R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  submission_id TEXT NOT NULL,
  submitted_by TEXT NOT NULL,
  cancelled_by TEXT NOT NULL DEFAULT '',
  run_dir TEXT NOT NULL DEFAULT '',
  root_cause TEXT NOT NULL DEFAULT '',
  state INTEGER NOT NULL,
  spec BLOB NOT NULL,         -- stagehand.JobSpec, serialized
  devices BLOB NOT NULL,      -- stagehand.control.Devices, serialized
  submitted_us INTEGER,       -- Unix microseconds; NULL while unset
  started_us INTEGER,
  ended_us INTEGER,
  exit_code INTEGER NOT NULL DEFAULT 0,
  steps_done INTEGER NOT NULL DEFAULT 0,
  spec_digest TEXT NOT NULL,
  UNIQUE (submitted_by, submission_id)
);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE TABLE tokens (
  name TEXT PRIMARY KEY,
  role INTEGER NOT NULL,
  hash TEXT NOT NULL,
  created_us INTEGER,
  revoked_us INTEGER          -- NULL while the token is valid; a revoked token's row stays, so its name is never reused
);
)sql";

// Schema 1 to 2: revoking a token marks its row instead of deleting it.
constexpr char kMigrate1To2[] = "ALTER TABLE tokens ADD COLUMN revoked_us INTEGER";

// The columns Row() reads, in its order. A macro so that each statement stays one string literal (the
// statement cache is keyed by the literal's address).
#define STAGEHAND_JOB_COLUMNS                                                                                \
  "id, submission_id, submitted_by, cancelled_by, run_dir, root_cause, state, spec, devices, submitted_us, " \
  "started_us, ended_us, exit_code, steps_done, seq, spec_digest"

constexpr char kSelectById[] = "SELECT " STAGEHAND_JOB_COLUMNS " FROM jobs WHERE id = ?1";
constexpr char kSelectBySubmission[] =
    "SELECT " STAGEHAND_JOB_COLUMNS " FROM jobs WHERE submitted_by = ?1 AND submission_id = ?2";
// ?1: a bit mask of the states wanted.
// ?3: only seqs below it (a page after the job with that seq).
constexpr char kSelectList[] =
    "SELECT " STAGEHAND_JOB_COLUMNS " FROM jobs WHERE (?1 >> state) & 1 AND seq < ?3 ORDER BY seq DESC LIMIT ?2";
constexpr char kDeleteJob[] = "DELETE FROM jobs WHERE id = ?1 AND state NOT IN (?2, ?3)";
constexpr char kSelectQueued[] = "SELECT " STAGEHAND_JOB_COLUMNS " FROM jobs WHERE state = ?1 ORDER BY seq";
constexpr char kInsertJob[] =
    "INSERT INTO jobs (id, submission_id, submitted_by, cancelled_by, run_dir, root_cause, state, spec, devices, "
    "submitted_us, started_us, ended_us, exit_code, steps_done, spec_digest) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";
constexpr char kMarkRunning[] =
    "UPDATE jobs SET state = ?2, started_us = ?3, devices = ?4, run_dir = ?5 WHERE id = ?1 AND state = ?6";
constexpr char kMarkEnded[] =
    "UPDATE jobs SET state = ?2, ended_us = ?3, exit_code = ?4, root_cause = ?5, steps_done = ?6 "
    "WHERE id = ?1 AND state IN (?7, ?8)";
constexpr char kSetStepsDone[] = "UPDATE jobs SET steps_done = ?2 WHERE id = ?1";
constexpr char kSetCancelledBy[] = "UPDATE jobs SET cancelled_by = ?2 WHERE id = ?1";
constexpr char kMarkLost[] = "UPDATE jobs SET state = ?1, ended_us = ?2, root_cause = ?3 WHERE state = ?4";
constexpr char kInsertToken[] = "INSERT INTO tokens (name, role, hash, created_us) VALUES (?1, ?2, ?3, ?4)";
constexpr char kSelectTokens[] = "SELECT name, role, hash, created_us, revoked_us FROM tokens ORDER BY name";
constexpr char kSelectTokenRevoked[] = "SELECT revoked_us FROM tokens WHERE name = ?1";
constexpr char kRevokeToken[] = "UPDATE tokens SET revoked_us = ?2 WHERE name = ?1 AND revoked_us IS NULL";

#undef STAGEHAND_JOB_COLUMNS

absl::StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {  // the primary code of an extended one
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_CORRUPT:
    case SQLITE_IOERR:
      return absl::StatusCode::kDataLoss;
    case SQLITE_NOTADB:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
      return absl::StatusCode::kPermissionDenied;
    case SQLITE_CONSTRAINT:
      return absl::StatusCode::kAlreadyExists;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode ErrnoCode(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOTDIR:
    case EEXIST:
      return absl::StatusCode::kFailedPrecondition;
    case ENOSPC:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

// mkdir -p, new directories 0700: the store holds token hashes and the server's job history.
absl::Status MakeStateDir(const std::string& dir) {
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::Status(ErrnoCode(errno), absl::StrCat("cannot create the state directory ", prefix, ": ",
                                                         ErrnoText(errno), "; pass a --state_dir you can write in"));
    }
    if (end == std::string::npos) break;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("the state directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

// An exclusive lock on <dir>/jobs.lock for the life of the store, holding the owner's pid: two servers
// on one state directory would each run the other's queued jobs and mark its running ones LOST.
absl::StatusOr<UniqueFd> LockStateDir(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/jobs.lock");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return absl::Status(ErrnoCode(errno), absl::StrCat("cannot open ", path, ": ", ErrnoText(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", ErrnoText(err)));
    char pid[32] = {};
    const ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    std::string owner = n > 0 ? std::string(pid, n) : "?";
    while (!owner.empty() && owner.back() == '\n') owner.pop_back();
    return absl::FailedPreconditionError(absl::StrCat("another process (pid ", owner, ") holds ", path,
                                                      ": is a launcher --serve running on this --state_dir? stop it, "
                                                      "or pass another --state_dir"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
    // Only the message of a second server is the poorer for it: the lock is what matters.
  }
  return fd;
}

int64_t ToMicros(absl::Time t) { return absl::ToUnixMicros(t); }

int64_t ToMillis(absl::Time t) { return t == absl::InfinitePast() ? 0 : absl::ToUnixMillis(t); }

// A bit per state, for kSelectList; every state when `states` is empty.
int64_t StateMask(const std::vector<control::JobState>& states) {
  if (states.empty()) return -1;
  int64_t mask = 0;
  for (control::JobState s : states) {
    if (s >= 0 && s < 63) mask |= int64_t{1} << s;
  }
  return mask;
}

}  // namespace

// A prepared statement of the cache, bound for one use: reset and unbound when it goes out of scope,
// so that the next user starts clean and no read transaction is left open. A failed bind is kept and
// returned by Step, so that call sites check one code.
class JobStore::Statement {
 public:
  explicit Statement(sqlite3_stmt* st) : st_(st) {}
  Statement(Statement&& other) noexcept : st_(std::exchange(other.st_, nullptr)), rc_(other.rc_) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() {
    if (st_ == nullptr) return;
    sqlite3_reset(st_);
    sqlite3_clear_bindings(st_);
  }

  Statement& Text(int i, const std::string& v) {
    return Keep(sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Statement& Blob(int i, const std::string& v) {
    return Keep(sqlite3_bind_blob(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Statement& Int(int i, int64_t v) { return Keep(sqlite3_bind_int64(st_, i, v)); }
  // NULL for an unset time.
  Statement& Time(int i, absl::Time t) {
    return Keep(t == absl::InfinitePast() ? sqlite3_bind_null(st_, i) : sqlite3_bind_int64(st_, i, ToMicros(t)));
  }

  // SQLITE_ROW, SQLITE_DONE, or an error.
  int Step() { return rc_ != SQLITE_OK ? rc_ : sqlite3_step(st_); }
  sqlite3_stmt* get() const { return st_; }

 private:
  Statement& Keep(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
    return *this;
  }

  sqlite3_stmt* st_;
  int rc_ = SQLITE_OK;
};

namespace {

std::string ColumnText(sqlite3_stmt* st, int i) {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(st, i));
  return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(st, i));
}

absl::Time ColumnTime(sqlite3_stmt* st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? absl::InfinitePast()
                                                   : absl::FromUnixMicros(sqlite3_column_int64(st, i));
}

}  // namespace

control::JobInfo ToJobInfo(const JobRecord& job) {
  control::JobInfo info;
  info.set_id(job.id);
  info.set_submission_id(job.submission_id);
  info.set_name(job.spec.name());
  info.set_state(job.state);
  *info.mutable_spec() = job.spec;
  *info.mutable_devices() = job.devices;
  info.set_submitted_by(job.submitted_by);
  info.set_cancelled_by(job.cancelled_by);
  info.set_submit_time_ms(ToMillis(job.submitted));
  info.set_start_time_ms(ToMillis(job.started));
  info.set_end_time_ms(ToMillis(job.ended));
  info.set_exit_code(job.exit_code);
  info.set_root_cause(job.root_cause);
  info.set_run_dir(job.run_dir);
  info.set_steps_done(job.steps_done);
  return info;
}

control::TokenInfo ToTokenInfo(const TokenRecord& token) {
  control::TokenInfo info;
  info.set_name(token.name);
  info.set_role(token.role);
  info.set_created_time_ms(ToMillis(token.created));
  info.set_revoked_time_ms(ToMillis(token.revoked));
  return info;
}

std::string SubmissionDigest(const control::SubmitJobRequest& request) {
  control::SubmitJobRequest copy = request;
  copy.clear_submission_id();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);  // map fields in key order: the same request, the same bytes
    copy.SerializeToCodedStream(&coded);
  }
  const Sha256Digest d = Sha256(bytes);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

JobStore::JobStore(std::string path, sqlite3* db, UniqueFd lock)
    : path_(std::move(path)), lock_(std::move(lock)), db_(db) {}

JobStore::~JobStore() {
  absl::MutexLock l(&mu_);
  for (auto& [sql, st] : statements_) sqlite3_finalize(st);
  sqlite3_close(db_);  // checkpoints the WAL into jobs.db and removes it: the last connection
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("no state directory; pass --state_dir=DIR");
  if (absl::Status s = MakeStateDir(dir); !s.ok()) return s;
  absl::StatusOr<UniqueFd> lock = LockStateDir(dir);
  if (!lock.ok()) return lock.status();
  const std::string path = absl::StrCat(dir, "/jobs.db");
  sqlite3* db = nullptr;
#ifdef SQLITE_OPEN_NOFOLLOW
  constexpr int kNoFollow = SQLITE_OPEN_NOFOLLOW;  // a link planted at jobs.db is refused, not followed
#else
  constexpr int kNoFollow = 0;
#endif
  const int rc = sqlite3_open_v2(path.c_str(), &db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | kNoFollow, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s(CodeOf(rc),
                   absl::StrCat(path, ": cannot open it: ", db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<JobStore> store(new JobStore(path, db, *std::move(lock)));
  absl::MutexLock l(&store->mu_);
  if (absl::Status s = store->Init(); !s.ok()) return s;
  return store;
}

absl::Status JobStore::Init() {
  sqlite3_extended_result_codes(db_, 1);
  if (int rc = sqlite3_busy_timeout(db_, kBusyTimeoutMs); rc != SQLITE_OK) return Error(rc, "busy_timeout");
  // The header first, read-only: a file that is not ours is refused before anything writes to it.
  if (absl::Status s = CheckHeader(); !s.ok()) return s;
  if (absl::Status s = UseWal(); !s.ok()) return s;
  if (absl::Status s = Exec("PRAGMA synchronous = FULL"); !s.ok()) return s;
  absl::StatusOr<int64_t> version = QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*version == 0) return CreateSchema();
  if (*version == 1) return Migrate(kMigrate1To2, 2);
  return absl::OkStatus();  // kSchemaVersion; CheckHeader refused anything newer
}

absl::Status JobStore::UseWal() {
  absl::StatusOr<Statement> wal = Prepare("PRAGMA journal_mode = WAL");
  if (!wal.ok()) return wal.status();
  if (int rc = wal->Step(); rc != SQLITE_ROW) return Error(rc, "PRAGMA journal_mode = WAL");
  if (const std::string mode = ColumnText(wal->get(), 0); mode != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(path_,
                                                      ": SQLite cannot use a write-ahead log here (journal_mode "
                                                      "stays ",
                                                      mode, "); pass a --state_dir on a local disk"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::CheckHeader() {
  absl::StatusOr<int64_t> app = QueryInt("PRAGMA application_id");
  if (!app.ok() && app.status().code() == absl::StatusCode::kFailedPrecondition) {  // SQLITE_NOTADB
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " is not a stagehand job store (SQLite: ", sqlite3_errstr(SQLITE_NOTADB),
                     "); move it away, or pass another --state_dir"));
  }
  if (!app.ok()) return app.status();
  absl::StatusOr<int64_t> version = QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  absl::StatusOr<int64_t> tables = QueryInt("SELECT count(*) FROM sqlite_master");
  if (!tables.ok()) return tables.status();
  const bool fresh = *app == 0 && *version == 0 && *tables == 0;
  if (!fresh && *app != kApplicationId) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is another program's SQLite database, not a stagehand job store (application_id %#x); move it away, "
        "or pass another --state_dir",
        path_, static_cast<uint32_t>(*app)));
  }
  if (*version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path_, " was written by a newer stagehand (schema version ",
                                                      *version, "; this launcher reads up to ", kSchemaVersion,
                                                      "): run the newer launcher, or pass another --state_dir"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::CreateSchema() {
  if (absl::Status s = Begin(); !s.ok()) return s;
  absl::Status body = Exec(kSchema);
  if (body.ok()) body = Exec(absl::StrCat("PRAGMA application_id = ", kApplicationId).c_str());
  if (body.ok()) body = Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str());
  return Commit(body);
}

absl::Status JobStore::Migrate(const char* sql, int64_t to_version) {
  if (absl::Status s = Begin(); !s.ok()) return s;
  absl::Status body = Exec(sql);
  if (body.ok()) body = Exec(absl::StrCat("PRAGMA user_version = ", to_version).c_str());
  return Commit(body);  // all or nothing: a failed migration leaves the file at its old version
}

absl::Status JobStore::Error(int rc, const std::string& what) {
  return absl::Status(CodeOf(rc), absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const char* sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return absl::OkStatus();
  absl::Status s(CodeOf(rc), absl::StrCat(path_, ": ", sql, ": ", message != nullptr ? message : sqlite3_errstr(rc)));
  sqlite3_free(message);
  return s;
}

absl::StatusOr<int64_t> JobStore::QueryInt(const char* sql) {
  absl::StatusOr<Statement> st = Prepare(sql);
  if (!st.ok()) return st.status();
  if (int rc = st->Step(); rc != SQLITE_ROW) return Error(rc, sql);
  return sqlite3_column_int64(st->get(), 0);
}

absl::StatusOr<JobStore::Statement> JobStore::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it != statements_.end()) return Statement(it->second);
  sqlite3_stmt* st = nullptr;
  if (int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr); rc != SQLITE_OK) {
    return Error(rc, absl::StrCat("cannot prepare \"", sql, "\""));
  }
  statements_[sql] = st;
  return Statement(st);
}

// IMMEDIATE: takes the write lock now, so that a transaction that reads then writes cannot fail
// half-way on a lock another connection took in between.
absl::Status JobStore::Begin() { return Exec("BEGIN IMMEDIATE"); }

absl::Status JobStore::Commit(absl::Status body) {
  if (body.ok()) {
    body = Exec("COMMIT");
    if (body.ok()) return body;
  }
  // SQLite may have rolled back already (a full disk does); a ROLLBACK then fails harmlessly.
  (void)Exec("ROLLBACK");
  return body;
}

absl::StatusOr<JobRecord> JobStore::Row(sqlite3_stmt* st) {
  JobRecord job;
  job.id = ColumnText(st, 0);
  job.submission_id = ColumnText(st, 1);
  job.submitted_by = ColumnText(st, 2);
  job.cancelled_by = ColumnText(st, 3);
  job.run_dir = ColumnText(st, 4);
  job.root_cause = ColumnText(st, 5);
  const int64_t state = sqlite3_column_int64(st, 6);
  if (!control::JobState_IsValid(static_cast<int>(state)) || !job.spec.ParseFromString(ColumnText(st, 7)) ||
      !job.devices.ParseFromString(ColumnText(st, 8))) {
    return absl::DataLossError(absl::StrCat(path_, ": job ", job.id,
                                            " is damaged (its state, spec or devices do "
                                            "not parse)"));
  }
  job.state = static_cast<control::JobState>(state);
  job.submitted = ColumnTime(st, 9);
  job.started = ColumnTime(st, 10);
  job.ended = ColumnTime(st, 11);
  job.exit_code = static_cast<int>(sqlite3_column_int64(st, 12));
  job.steps_done = sqlite3_column_int64(st, 13);
  job.seq = sqlite3_column_int64(st, 14);
  job.spec_digest = ColumnText(st, 15);
  return job;
}

absl::StatusOr<std::vector<JobRecord>> JobStore::Rows(Statement& st) {
  std::vector<JobRecord> jobs;
  for (;;) {
    const int rc = st.Step();
    if (rc == SQLITE_DONE) return jobs;
    if (rc != SQLITE_ROW) return Error(rc, "cannot read the jobs");
    absl::StatusOr<JobRecord> job = Row(st.get());
    if (!job.ok()) return job.status();
    jobs.push_back(*std::move(job));
  }
}

absl::StatusOr<std::optional<JobRecord>> JobStore::GetLocked(const std::string& id) {
  absl::StatusOr<Statement> st = Prepare(kSelectById);
  if (!st.ok()) return st.status();
  st->Text(1, id);
  absl::StatusOr<std::vector<JobRecord>> rows = Rows(*st);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::nullopt;
  return std::move(rows->front());
}

absl::StatusOr<std::optional<JobRecord>> JobStore::FindSubmission(const std::string& by,
                                                                  const std::string& submission_id) {
  absl::StatusOr<Statement> st = Prepare(kSelectBySubmission);
  if (!st.ok()) return st.status();
  st->Text(1, by).Text(2, submission_id);
  absl::StatusOr<std::vector<JobRecord>> rows = Rows(*st);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::nullopt;
  return std::move(rows->front());
}

absl::StatusOr<JobRecord> JobStore::Insert(JobRecord job) {
  if (job.id.empty() || job.submission_id.empty()) {
    return absl::InvalidArgumentError("a job needs an id and a submission id");
  }
  absl::MutexLock l(&mu_);
  if (absl::Status s = Begin(); !s.ok()) return s;
  absl::StatusOr<JobRecord> result = InsertLocked(std::move(job));
  if (absl::Status s = Commit(result.status()); !s.ok()) return s;
  return result;
}

absl::StatusOr<JobRecord> JobStore::InsertLocked(JobRecord job) {
  absl::StatusOr<std::optional<JobRecord>> earlier = FindSubmission(job.submitted_by, job.submission_id);
  if (!earlier.ok()) return earlier.status();
  if (earlier->has_value() && (*earlier)->spec_digest == job.spec_digest) return **std::move(earlier);
  if (earlier->has_value()) {
    return absl::AlreadyExistsError(absl::StrCat("submission id ", job.submission_id, " was used for another job (",
                                                 (*earlier)->id, "); submit with a fresh submission id"));
  }
  absl::StatusOr<std::optional<JobRecord>> same_id = GetLocked(job.id);
  if (!same_id.ok()) return same_id.status();
  if (same_id->has_value()) return absl::AlreadyExistsError(absl::StrCat("job id ", job.id, " is taken"));
  absl::StatusOr<Statement> st = Prepare(kInsertJob);
  if (!st.ok()) return st.status();
  st->Text(1, job.id).Text(2, job.submission_id).Text(3, job.submitted_by).Text(4, job.cancelled_by);
  st->Text(5, job.run_dir).Text(6, job.root_cause).Int(7, job.state);
  st->Blob(8, job.spec.SerializeAsString()).Blob(9, job.devices.SerializeAsString());
  st->Time(10, job.submitted).Time(11, job.started).Time(12, job.ended);
  st->Int(13, job.exit_code).Int(14, job.steps_done).Text(15, job.spec_digest);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot add job ", job.id));
  job.seq = sqlite3_last_insert_rowid(db_);
  return job;
}

absl::StatusOr<std::optional<JobRecord>> JobStore::Get(const std::string& id) {
  absl::MutexLock l(&mu_);
  return GetLocked(id);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::List(int limit, const std::vector<control::JobState>& states,
                                                      int64_t before_seq) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kSelectList);
  if (!st.ok()) return st.status();
  st->Int(1, StateMask(states)).Int(2, limit > 0 ? limit : -1);  // a negative LIMIT is none
  st->Int(3, before_seq > 0 ? before_seq : INT64_MAX);
  return Rows(*st);
}

absl::Status JobStore::Delete(const std::string& id) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kDeleteJob);
  if (!st.ok()) return st.status();
  st->Text(1, id).Int(2, control::JOB_STATE_QUEUED).Int(3, control::JOB_STATE_RUNNING);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot delete job ", id));
  return Changed(id, "ended (cancel it first)");
}

absl::StatusOr<std::vector<JobRecord>> JobStore::Queued() {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kSelectQueued);
  if (!st.ok()) return st.status();
  st->Int(1, control::JOB_STATE_QUEUED);
  return Rows(*st);
}

// After an UPDATE of job `id` that changed nothing: NOT_FOUND, or FAILED_PRECONDITION naming the state
// that stopped it.
absl::Status JobStore::Changed(const std::string& id, const char* what) {
  if (sqlite3_changes(db_) > 0) return absl::OkStatus();
  absl::StatusOr<std::optional<JobRecord>> job = GetLocked(id);
  if (!job.ok()) return job.status();
  if (!job->has_value()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::FailedPreconditionError(
      absl::StrCat("job ", id, " is ", control::JobState_Name((*job)->state), ", not ", what));
}

absl::Status JobStore::MarkRunning(const std::string& id, absl::Time started, const control::Devices& devices,
                                   const std::string& run_dir) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kMarkRunning);
  if (!st.ok()) return st.status();
  st->Text(1, id).Int(2, control::JOB_STATE_RUNNING).Time(3, started).Blob(4, devices.SerializeAsString());
  st->Text(5, run_dir).Int(6, control::JOB_STATE_QUEUED);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot mark job ", id, " running"));
  return Changed(id, "queued");
}

absl::Status JobStore::MarkEnded(const std::string& id, control::JobState state, absl::Time ended, int exit_code,
                                 const std::string& root_cause, int64_t steps_done) {
  if (state != control::JOB_STATE_SUCCEEDED && state != control::JOB_STATE_FAILED &&
      state != control::JOB_STATE_CANCELLED && state != control::JOB_STATE_LOST) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", id, " cannot end in ", control::JobState_Name(state), ": not a final state"));
  }
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kMarkEnded);
  if (!st.ok()) return st.status();
  st->Text(1, id).Int(2, state).Time(3, ended).Int(4, exit_code).Text(5, root_cause).Int(6, steps_done);
  st->Int(7, control::JOB_STATE_QUEUED).Int(8, control::JOB_STATE_RUNNING);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot mark job ", id, " ended"));
  return Changed(id, "queued or running");
}

absl::Status JobStore::SetStepsDone(const std::string& id, int64_t steps_done) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kSetStepsDone);
  if (!st.ok()) return st.status();
  st->Text(1, id).Int(2, steps_done);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot record the steps of ", id));
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::OkStatus();
}

absl::Status JobStore::SetCancelledBy(const std::string& id, const std::string& name) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kSetCancelledBy);
  if (!st.ok()) return st.status();
  st->Text(1, id).Text(2, name);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot record who cancelled ", id));
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<JobRecord>> JobStore::MarkRunningLost(absl::Time now, const std::string& reason) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = Begin(); !s.ok()) return s;
  absl::StatusOr<std::vector<JobRecord>> lost = MarkRunningLostLocked(now, reason);
  if (absl::Status s = Commit(lost.status()); !s.ok()) return s;
  return lost;
}

absl::StatusOr<std::vector<JobRecord>> JobStore::MarkRunningLostLocked(absl::Time now, const std::string& reason) {
  absl::StatusOr<std::vector<JobRecord>> running;
  {
    absl::StatusOr<Statement> select = Prepare(kSelectQueued);  // the same query, for another state
    if (!select.ok()) return select.status();
    select->Int(1, control::JOB_STATE_RUNNING);
    running = Rows(*select);
    if (!running.ok()) return running.status();
  }
  absl::StatusOr<Statement> update = Prepare(kMarkLost);
  if (!update.ok()) return update.status();
  update->Int(1, control::JOB_STATE_LOST).Time(2, now).Text(3, reason).Int(4, control::JOB_STATE_RUNNING);
  if (int rc = update->Step(); rc != SQLITE_DONE) return Error(rc, "cannot mark the running jobs lost");
  for (JobRecord& job : *running) {
    job.state = control::JOB_STATE_LOST;
    job.ended = now;
    job.root_cause = reason;
  }
  return running;
}

absl::Status JobStore::AddToken(const TokenRecord& token) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kInsertToken);
  if (!st.ok()) return st.status();
  st->Text(1, token.name).Int(2, token.role).Text(3, token.hash).Time(4, token.created);
  const int rc = st->Step();
  if ((rc & 0xff) == SQLITE_CONSTRAINT) {
    absl::StatusOr<Statement> revoked = Prepare(kSelectTokenRevoked);
    if (!revoked.ok()) return revoked.status();
    revoked->Text(1, token.name);
    if (revoked->Step() == SQLITE_ROW && sqlite3_column_type(revoked->get(), 0) != SQLITE_NULL) {
      return absl::AlreadyExistsError(absl::StrCat("a token named '", token.name,
                                                   "' was revoked, and names are never reused (its jobs keep their "
                                                   "owner); pick another name"));
    }
    return absl::AlreadyExistsError(absl::StrCat("a token named '", token.name, "' exists; pick another name"));
  }
  if (rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot add token '", token.name, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenRecord>> JobStore::FindTokens() {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kSelectTokens);
  if (!st.ok()) return st.status();
  std::vector<TokenRecord> tokens;
  for (;;) {
    const int rc = st->Step();
    if (rc == SQLITE_DONE) return tokens;
    if (rc != SQLITE_ROW) return Error(rc, "cannot read the tokens");
    TokenRecord t;
    t.name = ColumnText(st->get(), 0);
    const int64_t role = sqlite3_column_int64(st->get(), 1);
    t.role = control::Role_IsValid(static_cast<int>(role)) ? static_cast<control::Role>(role)
                                                           : control::ROLE_UNSPECIFIED;  // allows nothing
    t.hash = ColumnText(st->get(), 2);
    t.created = ColumnTime(st->get(), 3);
    t.revoked = ColumnTime(st->get(), 4);
    tokens.push_back(std::move(t));
  }
}

absl::Status JobStore::RevokeToken(const std::string& name, absl::Time when) {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare(kRevokeToken);
  if (!st.ok()) return st.status();
  st->Text(1, name).Time(2, when);
  if (int rc = st->Step(); rc != SQLITE_DONE) return Error(rc, absl::StrCat("cannot revoke token '", name, "'"));
  if (sqlite3_changes(db_) > 0) return absl::OkStatus();
  absl::StatusOr<Statement> revoked = Prepare(kSelectTokenRevoked);
  if (!revoked.ok()) return revoked.status();
  revoked->Text(1, name);
  if (revoked->Step() == SQLITE_ROW) return absl::NotFoundError(absl::StrCat("token '", name, "' is already revoked"));
  return absl::NotFoundError(absl::StrCat("no token named '", name, "'"));
}

absl::Status JobStore::CheckIntegrity() {
  absl::MutexLock l(&mu_);
  absl::StatusOr<Statement> st = Prepare("PRAGMA integrity_check");
  if (!st.ok()) return st.status();
  if (int rc = st->Step(); rc != SQLITE_ROW) return Error(rc, "PRAGMA integrity_check");
  const std::string verdict = ColumnText(st->get(), 0);
  if (verdict != "ok") return absl::DataLossError(absl::StrCat(path_, " is damaged: ", verdict));
  return absl::OkStatus();
}

}  // namespace stagehand
