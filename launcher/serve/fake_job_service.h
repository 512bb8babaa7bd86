// An in-memory JobService for the control adapter's and the client's tests: tokens with roles, jobs
// whose events, logs and files the test writes, and the role rules of control.proto.
#ifndef STAGEHAND_LAUNCHER_SERVE_FAKE_JOB_SERVICE_H_
#define STAGEHAND_LAUNCHER_SERVE_FAKE_JOB_SERVICE_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "launcher/serve/job_service.h"

namespace stagehand {

class FakeJobService : public JobService {
 public:
  void AddToken(const std::string& token, const std::string& name, control::Role role) {
    absl::MutexLock lock(&mu_);
    tokens_[token] = Caller{name, role};
  }

  // A running job with id `id` (its first event is its state).
  void AddJob(const std::string& id) {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[id];
    job.info.set_id(id);
    job.info.set_name(id);
    job.info.set_state(control::JOB_STATE_RUNNING);
    job.info.set_submitted_by("alice");
    PushLocked(job, [&](control::JobEvent& e) { *e.mutable_state() = job.info; });
  }
  void AddLine(const std::string& id, const std::string& line) {
    absl::MutexLock lock(&mu_);
    PushLocked(jobs_[id], [&](control::JobEvent& e) { e.set_line(line); });
  }
  void AddStep(const std::string& id, int64_t step) {
    absl::MutexLock lock(&mu_);
    PushLocked(jobs_[id], [&](control::JobEvent& e) { e.mutable_step()->set_step(step); });
  }
  // The final state event: nothing follows it.
  void EndJob(const std::string& id, control::JobState state, int exit_code) {
    absl::MutexLock lock(&mu_);
    EndLocked(jobs_[id], state, exit_code);
  }
  void AppendLog(const std::string& id, int rank, const std::string& data) {
    absl::MutexLock lock(&mu_);
    jobs_[id].logs[rank] += data;
  }
  void SetFile(const std::string& id, const std::string& path, const std::string& data) {
    absl::MutexLock lock(&mu_);
    jobs_[id].files[path] = data;
  }
  // The next Events call of any caller fails with `status` (a cut stream, as the client sees it).
  void FailNextEvents(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_next_events_ = std::move(status);
  }
  int submit_calls() const {
    absl::MutexLock lock(&mu_);
    return submit_calls_;
  }
  // The last Submit's request, as received.
  control::SubmitJobRequest last_submit() const {
    absl::MutexLock lock(&mu_);
    return last_submit_;
  }

  // What Info says the control protocol is (2 by default: commands known).
  void SetProtocol(int protocol) {
    absl::MutexLock lock(&mu_);
    protocol_ = protocol;
  }

  control::GetServerInfoResponse Info() override {
    control::GetServerInfoResponse r;
    r.set_version("fake");
    {
      absl::MutexLock lock(&mu_);
      r.set_protocol(protocol_);
    }
    r.set_cpu_workers(4);
    return r;
  }

  absl::StatusOr<Caller> Authenticate(absl::string_view token) override {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(std::string(token));
    if (token.empty() || it == tokens_.end()) {
      return absl::UnauthenticatedError("the server refused the token: ask its admin for one, or pass --token_file");
    }
    return it->second;
  }

  absl::StatusOr<control::JobInfo> Submit(const Caller& caller, const control::SubmitJobRequest& request) override {
    if (caller.role < control::ROLE_SUBMIT) return Denied(caller, "submit");
    absl::MutexLock lock(&mu_);
    ++submit_calls_;
    last_submit_ = request;
    for (const auto& [id, job] : jobs_) {
      if (job.info.submission_id() == request.submission_id()) return job.info;  // idempotent
    }
    const std::string id = absl::StrCat("job", jobs_.size() + 1);
    Job& job = jobs_[id];
    job.info.set_id(id);
    job.info.set_submission_id(request.submission_id());
    job.info.set_name(request.job().name());
    for (const std::string& word : request.program()) {
      job.info.set_command(job.info.command().empty() ? word : absl::StrCat(job.info.command(), " ", word));
    }
    *job.info.mutable_spec() = request.job();
    job.info.set_state(control::JOB_STATE_QUEUED);
    job.info.set_submitted_by(caller.name);
    PushLocked(job, [&](control::JobEvent& e) { *e.mutable_state() = job.info; });
    return job.info;
  }

  absl::StatusOr<control::JobInfo> Get(const Caller&, const std::string& id) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    return it->second.info;
  }

  // ListJobs pages of this many jobs when the request names no page_size (0: all at once).
  void SetPageSize(int n) {
    absl::MutexLock lock(&mu_);
    page_size_ = n;
  }

  // Pages of page_size jobs, in id order; the token is the next job's index.
  absl::StatusOr<control::ListJobsResponse> List(const Caller&, const control::ListJobsRequest& r) override {
    absl::MutexLock lock(&mu_);
    control::ListJobsRequest request = r;
    if (request.page_size() <= 0) request.set_page_size(page_size_);
    control::ListJobsResponse out;
    size_t first = 0;
    if (!request.page_token().empty()) first = std::stoul(request.page_token());
    size_t i = 0;
    for (const auto& [id, job] : jobs_) {
      if (i >= first && (request.page_size() <= 0 || out.jobs_size() < request.page_size())) {
        *out.add_jobs() = job.info;
      } else if (i >= first) {
        out.set_next_page_token(std::to_string(i));
        break;
      }
      ++i;
    }
    return out;
  }

  absl::StatusOr<std::string> Delete(const Caller& caller, const std::string& id) override {
    if (caller.role != control::ROLE_ADMIN) return Denied(caller, "delete jobs");
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    if (!it->second.ended) return absl::FailedPreconditionError(absl::StrCat("job ", id, " has not ended"));
    jobs_.erase(it);
    return absl::StrCat("/runs/", id);
  }

  absl::StatusOr<EventBatch> Events(const Caller&, const std::string& id, int64_t after_seq, bool lines,
                                    absl::Duration wait) override {
    absl::MutexLock lock(&mu_);
    if (!fail_next_events_.ok()) return std::exchange(fail_next_events_, absl::OkStatus());
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    const Job& job = it->second;
    if (after_seq > static_cast<int64_t>(job.events.size())) {
      return absl::OutOfRangeError(absl::StrCat("after_seq=", after_seq, " is ahead of the job's events"));
    }
    auto has_news = [&] { return static_cast<int64_t>(job.events.size()) > after_seq; };
    mu_.AwaitWithTimeout(absl::Condition(&has_news), wait);
    EventBatch batch;
    for (size_t i = after_seq; i < job.events.size(); ++i) {
      if (lines || job.events[i].event_case() != control::JobEvent::kLine) batch.events.push_back(job.events[i]);
    }
    batch.ended = job.ended;  // the batch runs to the end, the final state included
    return batch;
  }

  absl::StatusOr<control::JobInfo> Cancel(const Caller& caller, const std::string& id) override {
    if (caller.role < control::ROLE_SUBMIT) return Denied(caller, "cancel");
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    if (caller.role == control::ROLE_SUBMIT && it->second.info.submitted_by() != caller.name) {
      return absl::PermissionDeniedError(absl::StrCat("token ", caller.name, " may cancel only its own jobs; ", id,
                                                      " is ", it->second.info.submitted_by(), "'s"));
    }
    if (!it->second.ended) {
      it->second.info.set_cancelled_by(caller.name);
      EndLocked(it->second, control::JOB_STATE_CANCELLED, 130);
    }
    return it->second.info;
  }

  absl::StatusOr<LogRead> ReadLog(const Caller&, const std::string& id, int rank, int64_t offset, int64_t max_bytes,
                                  absl::Duration wait) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !it->second.logs.count(rank)) return NotFound(absl::StrCat(id, " rank ", rank));
    const Job& job = it->second;
    auto has_news = [&] { return static_cast<int64_t>(job.logs.at(rank).size()) > offset || job.ended; };
    mu_.AwaitWithTimeout(absl::Condition(&has_news), wait);
    const std::string& log = job.logs.at(rank);
    LogRead read;
    read.offset = offset;
    if (offset < static_cast<int64_t>(log.size())) read.data = log.substr(offset, max_bytes);
    read.ended = job.ended && offset + static_cast<int64_t>(read.data.size()) >= static_cast<int64_t>(log.size());
    return read;
  }

  absl::StatusOr<FileRead> ReadFile(const Caller&, const std::string& id, const std::string& path, int64_t offset,
                                    int64_t max_bytes) override {
    if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": outside the run directory"));
    }
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !it->second.files.count(path)) return NotFound(absl::StrCat(id, "/", path));
    const std::string& data = it->second.files.at(path);
    FileRead read;
    read.total_bytes = static_cast<int64_t>(data.size());
    if (offset < read.total_bytes) read.data = data.substr(offset, max_bytes);
    read.eof = offset + static_cast<int64_t>(read.data.size()) >= read.total_bytes;
    return read;
  }

  absl::StatusOr<std::string> MintToken(const Caller& caller, const std::string& name, control::Role role) override {
    if (caller.role != control::ROLE_ADMIN) return Denied(caller, "mint tokens");
    const std::string token = absl::StrCat("tok-", name);
    AddToken(token, name, role);
    return token;
  }

  absl::Status RevokeToken(const Caller& caller, const std::string& name) override {
    if (caller.role != control::ROLE_ADMIN) return Denied(caller, "revoke tokens");
    absl::MutexLock lock(&mu_);
    for (auto it = tokens_.begin(); it != tokens_.end(); ++it) {
      if (it->second.name == name) {
        tokens_.erase(it);
        return absl::OkStatus();
      }
    }
    return NotFound(absl::StrCat("token ", name));
  }

  absl::StatusOr<std::vector<control::TokenInfo>> ListTokens(const Caller& caller) override {
    if (caller.role != control::ROLE_ADMIN) return Denied(caller, "list tokens");
    absl::MutexLock lock(&mu_);
    std::vector<control::TokenInfo> out;
    for (const auto& [token, c] : tokens_) {
      control::TokenInfo info;
      info.set_name(c.name);
      info.set_role(c.role);
      out.push_back(std::move(info));
    }
    return out;
  }

 private:
  struct Job {
    control::JobInfo info;
    std::vector<control::JobEvent> events;
    bool ended = false;
    std::map<int, std::string> logs;
    std::map<std::string, std::string> files;
  };

  template <typename Fill>
  void PushLocked(Job& job, Fill fill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    control::JobEvent event;
    event.set_seq(static_cast<int64_t>(job.events.size()) + 1);
    event.set_time_ms(absl::ToUnixMillis(absl::Now()));
    fill(event);
    job.events.push_back(std::move(event));
  }
  void EndLocked(Job& job, control::JobState state, int exit_code) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.info.set_state(state);
    job.info.set_exit_code(exit_code);
    PushLocked(job, [&](control::JobEvent& e) { *e.mutable_state() = job.info; });
    job.ended = true;
  }
  static absl::Status Denied(const Caller& caller, absl::string_view what) {
    return absl::PermissionDeniedError(
        absl::StrCat("token ", caller.name, " (", control::Role_Name(caller.role), ") may not ", what));
  }
  static absl::Status NotFound(const std::string& what) { return absl::NotFoundError(absl::StrCat("no ", what)); }

  mutable absl::Mutex mu_;
  std::map<std::string, Caller> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_next_events_ ABSL_GUARDED_BY(mu_);
  int submit_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int page_size_ ABSL_GUARDED_BY(mu_) = 0;
  control::SubmitJobRequest last_submit_ ABSL_GUARDED_BY(mu_);
  int protocol_ ABSL_GUARDED_BY(mu_) = 2;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_FAKE_JOB_SERVICE_H_
