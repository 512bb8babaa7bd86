// Tokens and roles of `launcher --serve`: minting a token (the server keeps only its SHA-256),
// recognizing one, deciding what its role may do, the admin token of a first start, and the client's
// token file.
#ifndef STAGEHAND_LAUNCHER_SERVE_ACCESS_H_
#define STAGEHAND_LAUNCHER_SERVE_ACCESS_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto.h"
#include "control/bearer_token.h"
#include "launcher/serve/job_service.h"
#include "launcher/serve/job_store.h"
#include "control/roles.h"  // RoleName, ParseRole (the server names roles in its refusals)
#include "protos/control.pb.h"

namespace stagehand {

// What a call does, as far as roles go. kMint covers revoking too: both are the admin's, as is
// kDelete (removing an ended job from the store).
enum class Verb { kView, kSubmit, kCancel, kMint, kDelete };

// Token names and submission ids: [A-Za-z0-9._-]{1,64}, so that they are safe in a path, a log line
// and a shell. INVALID_ARGUMENT naming `what` ("token name").
absl::Status ValidateName(absl::string_view name, absl::string_view what);

// A new token: "sh_" and 64 hex digits of 32 random bytes from the kernel. UNAVAILABLE when the kernel
// gives no random bytes.
absl::StatusOr<std::string> MintToken();

// The hex SHA-256 of a token: what the store keeps. A token has 256 random bits, so an unsalted fast
// hash is enough (there is nothing to guess by brute force, unlike a password).
std::string TokenHash(absl::string_view token);

// Whether `caller` may do `verb`; `job_owner` is the submitted_by of the job a kCancel is about.
// view: view only; submit: also submit, and cancel its own jobs; admin: everything. PERMISSION_DENIED
// naming the token, its role and the role needed.
absl::Status Allow(const Caller& caller, Verb verb, const std::string& job_owner = "");

// The server's tokens, recognized in constant time. Thread-safe. Reads the store at Load and after
// each Mint and Revoke of its own; the store is the truth.
class Access {
 public:
  explicit Access(JobStore* store) : store_(store) {}

  // (Re)reads the tokens from the store.
  absl::Status Load();

  // The caller a token stands for. UNAUTHENTICATED for an empty or unknown token. The token's hash is
  // compared with every record's, whatever matched before, so the time taken says nothing about which
  // (or whether any) record was close.
  absl::StatusOr<Caller> Authenticate(absl::string_view token) const;

  // A new token named `name`, returned once (only its hash is kept). INVALID_ARGUMENT for a bad name or
  // role; ALREADY_EXISTS when the name is taken.
  absl::StatusOr<std::string> Mint(const std::string& name, control::Role role);

  // NOT_FOUND when there is no such token. Calls already authenticated with it finish.
  absl::Status Revoke(const std::string& name);

 private:
  struct Entry {
    std::string name;
    control::Role role = control::ROLE_UNSPECIFIED;
    Sha256Digest hash{};
    bool valid = false;  // the stored hash parsed: a damaged record matches nothing
  };

  JobStore* const store_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// On a first start (no valid admin token in the store), or with `mint_new` (the admin token was lost):
// mints an admin token (named "admin", or "admin2", ... when that name was ever taken), writes it alone
// on a line to <dir>/admin.token (mode 0600, atomically: a temporary file, fsync, rename) and returns
// the line to print. Otherwise mints nothing: returns "" or, when <dir>/admin.token is gone, a line
// saying so. Earlier admin tokens stay valid until revoked. Call it before Access::Load.
// FAILED_PRECONDITION when `dir` is writable by group or others: anyone who can write there could swap
// the store or read a token planted for them.
absl::StatusOr<std::string> EnsureAdminToken(JobStore& store, const std::string& dir, bool mint_new = false);

// Before the store is opened: the state directory's own files (jobs.db and its -wal, -shm and
// -journal, jobs.lock, every *.token) that exist must be regular files, not links, owned by this user
// and writable by no one else; token files readable by no one else either. FAILED_PRECONDITION with
// one line naming the file and what to run (chmod, or move it away); OK when `dir` does not exist yet.
absl::Status CheckStateFiles(const std::string& dir);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_ACCESS_H_
