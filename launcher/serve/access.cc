// Tokens and roles (see access.h).
#include "launcher/serve/access.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/input_file.h"

namespace stagehand {
namespace {

constexpr char kTokenPrefix[] = "sh_";
constexpr size_t kTokenBytes = 32;
constexpr size_t kMaxNameLength = 64;

std::string Hex(const uint8_t* p, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(p), n));
}

// The digest of a stored hex hash; false for anything but 64 hex digits.
bool ParseHash(const std::string& hex, Sha256Digest& out) {
  if (hex.size() != 2 * out.size()) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return true;
}

absl::StatusCode ErrnoCode(int err) {
  switch (err) {
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status Denied(const Caller& caller, absl::string_view needs) {
  return absl::PermissionDeniedError(
      absl::StrCat("token '", caller.name, "' has role ", RoleName(caller.role), "; ", needs));
}

// `contents` at `path`, mode 0600, whole or not at all (a temporary file, fsync, rename, fsync of the
// directory). The temporary file is created exclusively and not through a link, so nothing planted
// at its name receives the secret.
absl::Status WriteSecretFile(const std::string& dir, const std::string& name, absl::string_view contents) {
  const std::string path = absl::StrCat(dir, "/", name), tmp = absl::StrCat(dir, "/.", name, ".tmp");
  ::unlink(tmp.c_str());  // one a killed server left
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  int err = fd.valid() ? 0 : errno;
  if (err == 0 && ::fchmod(fd.get(), 0600) != 0) err = errno;  // whatever the umask
  for (absl::string_view rest = contents; err == 0 && !rest.empty();) {
    const ssize_t n = ::write(fd.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : EIO;
    if (n > 0) rest.remove_prefix(n);
  }
  if (err == 0 && ::fsync(fd.get()) != 0) err = errno;
  if (err == 0 && ::close(fd.release()) != 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return absl::Status(ErrnoCode(err), absl::StrCat("cannot write ", path, ": ", ErrnoText(err)));
  }
  if (UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d.valid()) ::fsync(d.get());
  return absl::OkStatus();
}

absl::Status CheckStateDirMode(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::Status(ErrnoCode(errno),
                        absl::StrCat("cannot stat the state directory ", dir, ": ", ErrnoText(errno)));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the state directory %s is writable by group or others (mode %04o): they could replace the job store or "
        "the admin token; run chmod go-w %s, or pass another --state_dir",
        dir, st.st_mode & 07777, dir));
  }
  return absl::OkStatus();
}

// "admin", or the first of "admin2", "admin3", ... that no token has.
std::string FreeAdminName(const std::vector<TokenRecord>& tokens) {
  for (int n = 1;; ++n) {
    const std::string name = n == 1 ? "admin" : absl::StrCat("admin", n);
    if (std::none_of(tokens.begin(), tokens.end(), [&](const TokenRecord& t) { return t.name == name; })) {
      return name;
    }
  }
}

}  // namespace

absl::Status ValidateName(absl::string_view name, absl::string_view what) {
  const bool chars_ok = std::all_of(name.begin(), name.end(),
                                    [](char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; });
  if (!name.empty() && name.size() <= kMaxNameLength && chars_ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " '", ClipInput(name, kMaxNameLength + 8), "' is not 1 to ",
                                                 kMaxNameLength, " of the characters A-Z a-z 0-9 . _ -"));
}

absl::StatusOr<std::string> MintToken() {
  uint8_t bytes[kTokenBytes];
  if (absl::Status s = RandomBytes(bytes, sizeof bytes); !s.ok()) return s;
  return absl::StrCat(kTokenPrefix, Hex(bytes, sizeof bytes));
}

std::string TokenHash(absl::string_view token) {
  const Sha256Digest d = Sha256(token);
  return Hex(d.data(), d.size());
}

absl::Status Allow(const Caller& caller, Verb verb, const std::string& job_owner) {
  const control::Role role = caller.role;
  if (role != control::ROLE_VIEW && role != control::ROLE_SUBMIT && role != control::ROLE_ADMIN) {
    return Denied(caller, "it may do nothing; ask the server's admin for a new token");
  }
  switch (verb) {
    case Verb::kView:
      return absl::OkStatus();
    case Verb::kSubmit:
      if (role != control::ROLE_VIEW) return absl::OkStatus();
      return Denied(caller, "submitting needs a submit or admin token");
    case Verb::kCancel:
      if (role == control::ROLE_ADMIN || (role == control::ROLE_SUBMIT && job_owner == caller.name)) {
        return absl::OkStatus();
      }
      if (role == control::ROLE_VIEW) return Denied(caller, "cancelling needs a submit or admin token");
      return Denied(caller, absl::StrCat("cancelling ", job_owner,
                                         "'s job needs an admin token (a submit token cancels only its own jobs)"));
    case Verb::kMint:
      if (role == control::ROLE_ADMIN) return absl::OkStatus();
      return Denied(caller, "minting, listing and revoking tokens needs an admin token");
    case Verb::kDelete:
      if (role == control::ROLE_ADMIN) return absl::OkStatus();
      return Denied(caller, "deleting a job needs an admin token");
  }
  return absl::InternalError("unknown verb");
}

absl::Status Access::Load() {
  absl::StatusOr<std::vector<TokenRecord>> tokens = store_->FindTokens();
  if (!tokens.ok()) return tokens.status();
  std::vector<Entry> entries;
  for (const TokenRecord& t : *tokens) {
    if (t.is_revoked()) continue;  // recognized no more; the record stays so that its name is not reused
    Entry e{t.name, t.role, {}, false};
    e.valid = ParseHash(t.hash, e.hash);
    entries.push_back(std::move(e));
  }
  absl::MutexLock l(&mu_);
  entries_ = std::move(entries);
  return absl::OkStatus();
}

absl::StatusOr<Caller> Access::Authenticate(absl::string_view token) const {
  if (token.empty()) return absl::UnauthenticatedError("no token: pass --token_file=FILE or set STAGEHAND_TOKEN_FILE");
  const Sha256Digest hash = Sha256(token);
  absl::MutexLock l(&mu_);
  const Entry* match = nullptr;
  // Every record is compared, with no early exit on a match.
  for (const Entry& e : entries_) {
    const bool equal = ConstantTimeEqual(e.hash, hash) & e.valid;
    match = equal ? &e : match;
  }
  if (match == nullptr) {
    return absl::UnauthenticatedError("the server refused the token: ask its admin for one, or pass --token_file");
  }
  return Caller{match->name, match->role};
}

absl::StatusOr<std::string> Access::Mint(const std::string& name, control::Role role) {
  if (absl::Status s = ValidateName(name, "token name"); !s.ok()) return s;
  if (role != control::ROLE_VIEW && role != control::ROLE_SUBMIT && role != control::ROLE_ADMIN) {
    return absl::InvalidArgumentError("a token needs a role: view, submit or admin");
  }
  absl::StatusOr<std::string> token = MintToken();
  if (!token.ok()) return token.status();
  if (absl::Status s = store_->AddToken({name, role, TokenHash(*token), absl::Now()}); !s.ok()) return s;
  if (absl::Status s = Load(); !s.ok()) return s;
  return token;
}

absl::Status Access::Revoke(const std::string& name) {
  if (absl::Status s = ValidateName(name, "token name"); !s.ok()) return s;  // echoed clipped, not whole
  if (absl::Status s = store_->RevokeToken(name, absl::Now()); !s.ok()) return s;
  return Load();
}

absl::Status CheckStateFiles(const std::string& dir) {
  std::vector<std::string> names = {"jobs.db", "jobs.db-wal", "jobs.db-shm", "jobs.db-journal", "jobs.lock"};
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::Status(ErrnoCode(errno),
                        absl::StrCat("cannot read the state directory ", dir, ": ", ErrnoText(errno)));
  }
  for (dirent* e = ::readdir(d); e != nullptr; e = ::readdir(d)) {
    if (absl::EndsWith(e->d_name, ".token")) names.push_back(e->d_name);
  }
  ::closedir(d);
  const uid_t me = ::geteuid();
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      return absl::Status(ErrnoCode(errno), absl::StrCat("cannot stat ", path, ": ", ErrnoText(errno)));
    }
    const bool token = absl::EndsWith(name, ".token");
    auto refuse = [&](absl::string_view why, absl::string_view fix) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the state directory's ", path, " ", why, ": whoever controls it could ",
          token ? "read or plant a token" : "replace the job store", "; ", fix, ", or pass another --state_dir"));
    };
    if (S_ISLNK(st.st_mode)) return refuse("is a symbolic link", absl::StrCat("replace it with the file itself (mv)"));
    if (!S_ISREG(st.st_mode)) return refuse("is not a regular file", absl::StrCat("move it away"));
    if (st.st_uid != me) {
      return refuse(absl::StrCat("is owned by uid ", st.st_uid, ", not by this server's user (uid ", me, ")"),
                    absl::StrCat("run chown ", me, " ", path));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return refuse(absl::StrFormat("is writable by group or others (mode %04o)", st.st_mode & 07777),
                    absl::StrCat("run chmod ", token ? "600 " : "go-w ", path));
    }
    if (token && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      return refuse(absl::StrFormat("can be read by group or others (mode %04o)", st.st_mode & 07777),
                    absl::StrCat("run chmod 600 ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EnsureAdminToken(JobStore& store, const std::string& dir, bool mint_new) {
  if (absl::Status s = CheckStateDirMode(dir); !s.ok()) return s;
  absl::StatusOr<std::vector<TokenRecord>> tokens = store.FindTokens();
  if (!tokens.ok()) return tokens.status();
  const std::string path = absl::StrCat(dir, "/admin.token");
  const bool have_admin = std::any_of(tokens->begin(), tokens->end(), [](const TokenRecord& t) {
    return t.role == control::ROLE_ADMIN && !t.is_revoked();
  });
  if (have_admin && !mint_new) {
    if (::access(path.c_str(), F_OK) == 0) return std::string();
    return absl::StrCat("note: ", path,
                        " is gone; the admin token minted before still works and is not minted "
                        "again (restart with --new_admin_token to mint another into that file)");
  }
  absl::StatusOr<std::string> token = MintToken();
  if (!token.ok()) return token.status();
  // The file first: should the server die between the two, the store has no admin token and the next
  // start mints another, over this file.
  const std::string name = FreeAdminName(*tokens);
  if (absl::Status s = WriteSecretFile(dir, "admin.token", *token + "\n"); !s.ok()) return s;
  if (absl::Status s = store.AddToken({name, control::ROLE_ADMIN, TokenHash(*token), absl::Now()}); !s.ok()) return s;
  return absl::StrCat("admin token '", name, "' written to ", path);
}

}  // namespace stagehand
