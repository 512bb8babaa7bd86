// The Control service's client (see control_client.h).
#include "client/control_client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace stagehand {
namespace {

constexpr int kSubmitAttempts = 5;

bool IsFinal(control::JobState state) {
  return state == control::JOB_STATE_SUCCEEDED || state == control::JOB_STATE_FAILED ||
         state == control::JOB_STATE_CANCELLED || state == control::JOB_STATE_LOST;
}

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  // gRPC's reconnect backoff starts at 1 s and grows to 2 min: too slow for resuming a watch.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // A watch can be quiet for minutes; pings notice a dead peer (the server allows one per 10 s).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  return args;
}

// A temporary file beside `path` that becomes `path` on Commit() and disappears otherwise.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), temp_(path_ + ".fetch-XXXXXX") {}
  ~AtomicFile() {
    if (fd_ >= 0) close(fd_);
    if (!committed_ && opened_) unlink(temp_.c_str());
  }
  absl::Status Open() {
    fd_ = mkstemp(temp_.data());
    if (fd_ < 0) return Error("cannot create a file beside");
    opened_ = true;
    fchmod(fd_, 0644);
    return absl::OkStatus();
  }
  absl::Status Write(absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Error("cannot write");
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
  absl::Status Commit() {
    if (fsync(fd_) != 0) return Error("cannot write");
    const int fd = std::exchange(fd_, -1);
    if (close(fd) != 0) return Error("cannot write");
    if (rename(temp_.c_str(), path_.c_str()) != 0) return Error("cannot rename the download to");
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    const absl::StatusCode code =
        errno == EACCES || errno == EPERM ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kFailedPrecondition;
    return absl::Status(code, absl::StrCat(what, " ", path_, ": ", std::strerror(errno),
                                           "; pass --output=PATH in a directory you can write"));
  }

  const std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool opened_ = false, committed_ = false;
};

// The reconnect budget of a followed stream (a watch, a followed log): watch_retries attempts within
// watch_retry_window, started over by a stream that delivered, with a doubling backoff between them.
class Reconnects {
 public:
  explicit Reconnects(const ControlClientOptions& o) : o_(o), start_(absl::Now()), backoff_(o.initial_backoff) {}
  // After a stream that ended short: false when the budget is spent, else true after the backoff.
  bool Again(bool progressed) {
    if (progressed) {
      retries_ = 0;
      start_ = absl::Now();
      backoff_ = o_.initial_backoff;
    }
    if (++retries_ > o_.watch_retries || absl::Now() - start_ > o_.watch_retry_window) return false;
    absl::SleepFor(backoff_);
    backoff_ = std::min(backoff_ * 2, o_.max_backoff);
    return true;
  }
  int made() const { return retries_ - 1; }  // the reconnects made before the budget ran out
  absl::Duration elapsed() const { return absl::Now() - start_; }

 private:
  const ControlClientOptions& o_;
  absl::Time start_;
  absl::Duration backoff_;
  int retries_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Create(const ControlClientOptions& options) {
  if (options.server.empty()) {
    return absl::InvalidArgumentError("no server: pass --server=HOST:PORT (or set STAGEHAND_SERVER)");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ClientTlsCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  ClientTlsInfo info{options.server, !options.tls.ca.empty() || !options.tls.cert.empty(), !options.tls.cert.empty()};
  auto channel = grpc::CreateCustomChannel(options.server, *credentials, ChannelArgs());
  return std::unique_ptr<ControlClient>(new ControlClient(options, control::Control::NewStub(channel), info));
}

std::unique_ptr<grpc::ClientContext> ControlClient::Context(bool unary, absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
  if (timeout <= absl::ZeroDuration()) timeout = options_.rpc_timeout;
  if (unary) context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::StatusOr<control::GetServerInfoResponse> ControlClient::Info() {
  control::GetServerInfoResponse response;
  grpc::Status s = stub_->GetServerInfo(Context(true).get(), {}, &response);
  if (!s.ok()) return Explain(s);
  return response;
}

absl::StatusOr<control::JobInfo> ControlClient::Submit(const control::SubmitJobRequest& request) {
  absl::Duration backoff = options_.initial_backoff;
  grpc::Status s;
  grpc::Status shutting_down;  // the server's own "shutting down", said over later tries that cannot connect
  for (int attempt = 1; attempt <= kSubmitAttempts; ++attempt) {
    control::JobInfo response;
    const absl::Time start = absl::Now();
    s = stub_->SubmitJob(Context(true, options_.submit_timeout).get(), request, &response);
    if (s.ok()) return response;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
        s.error_message().find("shutting down") != std::string::npos) {
      shutting_down = s;
    }
    if (!Retryable(s)) break;
    // DEADLINE_EXCEEDED before our own deadline is the server's answer (it gave up checking the
    // job): asking again would only wait as long again.
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && absl::Now() - start < options_.submit_timeout) break;
    if (attempt < kSubmitAttempts) absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  return Explain(shutting_down.ok() ? s : shutting_down);
}

absl::StatusOr<control::JobInfo> ControlClient::Get(const std::string& id) {
  control::GetJobRequest request;
  request.set_id(id);
  control::JobInfo response;
  grpc::Status s = stub_->GetJob(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return response;
}

absl::StatusOr<control::ListJobsResponse> ControlClient::List(const control::ListJobsRequest& request) {
  control::ListJobsResponse response;
  grpc::Status s = stub_->ListJobs(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return response;
}

absl::StatusOr<std::vector<control::JobInfo>> ControlClient::ListAll(const control::ListJobsRequest& base, int limit) {
  control::ListJobsRequest request = base;
  std::vector<control::JobInfo> jobs;
  // Bounded: a server that kept answering with a next page would otherwise hold the client forever.
  for (int page = 0; page < 100000; ++page) {
    if (limit > 0) request.set_page_size(std::min(100, limit - static_cast<int>(jobs.size())));
    absl::StatusOr<control::ListJobsResponse> reply = List(request);
    if (!reply.ok()) return reply.status();
    for (control::JobInfo& j : *reply->mutable_jobs()) jobs.push_back(std::move(j));
    if (reply->next_page_token().empty() || (limit > 0 && static_cast<int>(jobs.size()) >= limit)) break;
    if (reply->next_page_token() == request.page_token()) {
      return absl::InternalError("the server gave the same page twice; list again");
    }
    request.set_page_token(reply->next_page_token());
  }
  if (limit > 0 && static_cast<int>(jobs.size()) > limit) jobs.resize(limit);
  return jobs;
}

absl::StatusOr<std::string> ControlClient::Delete(const std::string& id) {
  control::DeleteJobRequest request;
  request.set_id(id);
  control::DeleteJobResponse response;
  grpc::Status s = stub_->DeleteJob(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return response.run_dir();
}

absl::StatusOr<control::JobInfo> ControlClient::Cancel(const std::string& id) {
  control::CancelJobRequest request;
  request.set_id(id);
  control::JobInfo response;
  grpc::Status s = stub_->CancelJob(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return response;
}

grpc::Status ControlClient::WatchOnce(const control::WatchJobRequest& base, int64_t& last_seq, bool& progressed,
                                      std::optional<control::JobInfo>& final_state,
                                      const std::function<void(const control::JobEvent&)>& on_event) {
  control::WatchJobRequest request = base;
  request.set_after_seq(last_seq);
  std::unique_ptr<grpc::ClientContext> context = Context(false);
  std::unique_ptr<grpc::ClientReader<control::JobEvent>> reader = stub_->WatchJob(context.get(), request);
  control::JobEvent event;
  while (reader->Read(&event)) {
    if (event.seq() <= last_seq) continue;  // never twice, whatever the server resends
    last_seq = event.seq();
    progressed = true;
    on_event(event);
    if (event.has_state() && IsFinal(event.state().state())) final_state = event.state();
  }
  return reader->Finish();
}

absl::StatusOr<control::JobInfo> ControlClient::Watch(const std::string& id, bool no_lines, int64_t after_seq,
                                                      const std::function<void(const control::JobEvent&)>& on_event) {
  control::WatchJobRequest request;
  request.set_id(id);
  request.set_no_lines(no_lines);
  int64_t last_seq = after_seq;
  Reconnects reconnects(options_);
  for (;;) {
    bool progressed = false;
    std::optional<control::JobInfo> final_state;
    grpc::Status s = WatchOnce(request, last_seq, progressed, final_state, on_event);
    if (final_state.has_value()) return *final_state;
    if (s.ok()) {
      // Ended without a final state: either we asked from past its end, or the stream was cut.
      absl::StatusOr<control::JobInfo> job = Get(id);
      if (job.ok() && IsFinal(job->state())) return job;
    } else if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return Explain(s);
    }
    if (!reconnects.Again(progressed)) {
      absl::Status e = s.ok() ? absl::UnavailableError("the stream ended without the job's final state") : Explain(s);
      return absl::UnavailableError(absl::StrCat(e.message(), "; gave up after ", reconnects.made(), " reconnects in ",
                                                 absl::FormatDuration(reconnects.elapsed()),
                                                 "; resume with `client watch ", id, "` later"));
    }
  }
}

absl::Status ControlClient::Logs(const std::string& id, int rank, int64_t offset, bool follow,
                                 const std::function<void(absl::string_view)>& on_data) {
  control::LogsRequest request;
  request.set_id(id);
  if (rank < 0) {
    request.set_launcher(true);
  } else {
    request.set_rank(rank);
  }
  request.set_follow(follow);
  Reconnects reconnects(options_);
  for (;;) {
    request.set_offset(offset);
    std::unique_ptr<grpc::ClientContext> context = Context(false);
    auto reader = stub_->Logs(context.get(), request);
    control::LogChunk chunk;
    bool progressed = false;
    while (reader->Read(&chunk)) {
      offset += static_cast<int64_t>(chunk.data().size());  // a reconnect asks from here: nothing twice
      progressed = progressed || !chunk.data().empty();
      on_data(chunk.data());
    }
    grpc::Status s = reader->Finish();
    // Only a followed log is worth reconnecting for.
    if (s.ok() || !follow || s.error_code() != grpc::StatusCode::UNAVAILABLE) return Explain(s);
    if (!reconnects.Again(progressed)) {
      return absl::UnavailableError(absl::StrCat(Explain(s).message(), "; gave up after ", reconnects.made(),
                                                 " reconnects; resume with `client logs ", id, " --rank=", rank,
                                                 " --offset=", offset, " --follow`"));
    }
  }
}

absl::StatusOr<int64_t> ControlClient::Fetch(const std::string& id, const std::string& path,
                                             const std::string& local_path) {
  AtomicFile file(local_path);
  if (absl::Status s = file.Open(); !s.ok()) return s;
  absl::StatusOr<int64_t> written = FetchTo(id, path, [&file](absl::string_view data) { return file.Write(data); });
  if (!written.ok()) return written.status();
  if (absl::Status s = file.Commit(); !s.ok()) return s;
  return written;
}

absl::StatusOr<int64_t> ControlClient::FetchTo(const std::string& id, const std::string& path,
                                               const std::function<absl::Status(absl::string_view)>& write) {
  control::FetchFileRequest request;
  request.set_id(id);
  request.set_path(path);
  std::unique_ptr<grpc::ClientContext> context = Context(false);
  auto reader = stub_->FetchFile(context.get(), request);
  control::FileChunk chunk;
  int64_t written = 0, total = -1;
  absl::Status write_error;
  while (write_error.ok() && reader->Read(&chunk)) {
    if (total < 0) total = chunk.total_bytes();
    write_error = write(chunk.data());
    written += static_cast<int64_t>(chunk.data().size());
  }
  if (!write_error.ok()) {
    context->TryCancel();
    reader->Finish();
    return write_error;
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return Explain(s);
  if (written != total) {
    return absl::DataLossError(absl::StrCat(path, ": got ", written, " of ", total, " bytes; fetch it again"));
  }
  return written;
}

absl::StatusOr<std::string> ControlClient::Mint(const std::string& name, control::Role role) {
  control::MintTokenRequest request;
  request.set_name(name);
  request.set_role(role);
  control::MintTokenResponse response;
  grpc::Status s = stub_->MintToken(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return response.token();
}

absl::Status ControlClient::Revoke(const std::string& name) {
  control::RevokeTokenRequest request;
  request.set_name(name);
  control::RevokeTokenResponse response;
  return Explain(stub_->RevokeToken(Context(true).get(), request, &response));
}

absl::StatusOr<std::vector<control::TokenInfo>> ControlClient::ListTokens() {
  control::ListTokensRequest request;
  control::ListTokensResponse response;
  grpc::Status s = stub_->ListTokens(Context(true).get(), request, &response);
  if (!s.ok()) return Explain(s);
  return std::vector<control::TokenInfo>(response.tokens().begin(), response.tokens().end());
}

}  // namespace stagehand
