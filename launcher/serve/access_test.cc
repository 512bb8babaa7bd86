// Tests of tokens and roles (access.h) over a real job store under TEST_TMPDIR.
#include "launcher/serve/access.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::string TempPath(const std::string& suffix = "") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", test->name(), "_", ::getpid(), suffix);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempPath();
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    access_ = std::make_unique<Access>(store_.get());
    ASSERT_TRUE(access_->Load().ok());
  }

  std::string dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Access> access_;
};

TEST(TokenTest, MintToken_Twice_DiffersAndHasTheFormat) {
  absl::StatusOr<std::string> a = MintToken(), b = MintToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(*a, MatchesRegex("sh_[0-9a-f]{64}"));
  EXPECT_NE(*a, *b);
}

TEST(TokenTest, TokenHash_Abc_IsItsSha256Hex) {
  EXPECT_EQ(TokenHash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenTest, ParseRole_EachName_RoundTrips) {
  for (control::Role role : {control::ROLE_VIEW, control::ROLE_SUBMIT, control::ROLE_ADMIN}) {
    EXPECT_EQ(*ParseRole(RoleName(role)), role);
  }
  EXPECT_EQ(ParseRole("root").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RoleName(control::ROLE_UNSPECIFIED), "unspecified");
}

TEST(TokenTest, ValidateName_Characters_FollowTheRule) {
  EXPECT_TRUE(ValidateName("bob.ci-2_x", "token name").ok());
  EXPECT_TRUE(ValidateName(std::string(64, 'a'), "token name").ok());
  EXPECT_FALSE(ValidateName(std::string(65, 'a'), "token name").ok());
  EXPECT_FALSE(ValidateName("", "token name").ok());
  EXPECT_FALSE(ValidateName("a/b", "token name").ok());
  absl::Status s = ValidateName("a b", "submission id");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("submission id 'a b'"));
}

TEST_F(AccessTest, Authenticate_MintedToken_IsItsCaller) {
  absl::StatusOr<std::string> bob = access_->Mint("bob", control::ROLE_SUBMIT);
  ASSERT_TRUE(bob.ok()) << bob.status();
  ASSERT_TRUE(access_->Mint("carol", control::ROLE_VIEW).ok());
  absl::StatusOr<Caller> caller = access_->Authenticate(*bob);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->name, "bob");
  EXPECT_EQ(caller->role, control::ROLE_SUBMIT);
  // The store keeps the hash, not the token.
  EXPECT_EQ((*store_->FindTokens())[0].hash, TokenHash(*bob));
}

TEST_F(AccessTest, Authenticate_UnknownOrEmptyToken_IsUnauthenticated) {
  ASSERT_TRUE(access_->Mint("bob", control::ROLE_SUBMIT).ok());
  absl::StatusOr<Caller> unknown = access_->Authenticate("sh_0000");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unknown.status().message(), "the server refused the token: ask its admin for one, or pass --token_file");
  absl::StatusOr<Caller> empty = access_->Authenticate("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(empty.status().message(), "no token: pass --token_file=FILE or set STAGEHAND_TOKEN_FILE");
}

TEST_F(AccessTest, Revoke_MintedToken_IsRefusedAfterwards) {
  absl::StatusOr<std::string> bob = access_->Mint("bob", control::ROLE_VIEW);
  ASSERT_TRUE(bob.ok());
  ASSERT_TRUE(access_->Revoke("bob").ok());
  EXPECT_EQ(access_->Authenticate(*bob).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(access_->Revoke("bob").code(), absl::StatusCode::kNotFound);
  // Its name stays taken: a new "bob" would own the old one's jobs.
  absl::StatusOr<std::string> again = access_->Mint("bob", control::ROLE_SUBMIT);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("was revoked"));
}

TEST_F(AccessTest, Mint_BadNameRoleOrTakenName_IsRefused) {
  EXPECT_EQ(access_->Mint("a b", control::ROLE_VIEW).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(access_->Mint("bob", control::ROLE_UNSPECIFIED).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(access_->Mint("bob", control::ROLE_VIEW).ok());
  EXPECT_EQ(access_->Mint("bob", control::ROLE_ADMIN).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(AllowTest, Allow_EachRoleAndVerb_FollowsTheRule) {
  const Caller view{"v", control::ROLE_VIEW}, submit{"s", control::ROLE_SUBMIT}, admin{"a", control::ROLE_ADMIN};
  EXPECT_TRUE(Allow(view, Verb::kView).ok());
  EXPECT_FALSE(Allow(view, Verb::kSubmit).ok());
  EXPECT_FALSE(Allow(view, Verb::kCancel, "v").ok());
  EXPECT_FALSE(Allow(view, Verb::kMint).ok());
  EXPECT_TRUE(Allow(submit, Verb::kView).ok());
  EXPECT_TRUE(Allow(submit, Verb::kSubmit).ok());
  EXPECT_TRUE(Allow(submit, Verb::kCancel, "s").ok());
  EXPECT_FALSE(Allow(submit, Verb::kCancel, "other").ok());
  EXPECT_FALSE(Allow(submit, Verb::kMint).ok());
  for (Verb verb : {Verb::kView, Verb::kSubmit, Verb::kCancel, Verb::kMint}) {
    EXPECT_TRUE(Allow(admin, verb, "other").ok());
    EXPECT_EQ(Allow(Caller{"x", control::ROLE_UNSPECIFIED}, verb).code(), absl::StatusCode::kPermissionDenied);
  }
}

TEST(AllowTest, Allow_Refused_NamesTheRoleAndWhatIsNeeded) {
  absl::Status s = Allow(Caller{"bob", control::ROLE_VIEW}, Verb::kSubmit);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "token 'bob' has role view; submitting needs a submit or admin token");
  EXPECT_EQ(Allow(Caller{"bob", control::ROLE_SUBMIT}, Verb::kCancel, "alice").message(),
            "token 'bob' has role submit; cancelling alice's job needs an admin token (a submit token cancels only "
            "its own jobs)");
  EXPECT_EQ(Allow(Caller{"bob", control::ROLE_SUBMIT}, Verb::kMint).message(),
            "token 'bob' has role submit; minting, listing and revoking tokens needs an admin token");
}

TEST_F(AccessTest, EnsureAdminToken_FirstStart_WritesAPrivateFileTheServerAccepts) {
  absl::StatusOr<std::string> line = EnsureAdminToken(*store_, dir_);
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string path = dir_ + "/admin.token";
  EXPECT_EQ(*line, absl::StrCat("admin token 'admin' written to ", path));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600);
  const std::string text = Slurp(path);
  EXPECT_THAT(text, MatchesRegex("sh_[0-9a-f]{64}\n"));
  ASSERT_TRUE(access_->Load().ok());
  absl::StatusOr<Caller> caller = access_->Authenticate(text.substr(0, text.size() - 1));
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->role, control::ROLE_ADMIN);
  EXPECT_EQ(caller->name, "admin");
}

TEST_F(AccessTest, EnsureAdminToken_LaterStart_MintsNothing) {
  ASSERT_TRUE(EnsureAdminToken(*store_, dir_).ok());
  const std::string path = dir_ + "/admin.token", first = Slurp(path);
  absl::StatusOr<std::string> again = EnsureAdminToken(*store_, dir_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, "");
  EXPECT_EQ(Slurp(path), first);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  absl::StatusOr<std::string> gone = EnsureAdminToken(*store_, dir_);
  ASSERT_TRUE(gone.ok());
  EXPECT_THAT(*gone, HasSubstr(path + " is gone"));
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(store_->FindTokens()->size(), 1u);
}

TEST_F(AccessTest, EnsureAdminToken_NewAdminTokenAsked_MintsAnotherBesideTheFirst) {
  ASSERT_TRUE(EnsureAdminToken(*store_, dir_).ok());
  const std::string path = dir_ + "/admin.token";
  const std::string first = Slurp(path);
  ASSERT_EQ(::unlink(path.c_str()), 0);  // lost
  absl::StatusOr<std::string> line = EnsureAdminToken(*store_, dir_, /*mint_new=*/true);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("admin token 'admin2'"));
  const std::string second = Slurp(path);
  EXPECT_NE(second, first);
  ASSERT_TRUE(access_->Load().ok());
  absl::StatusOr<Caller> caller = access_->Authenticate(std::string(absl::StripTrailingAsciiWhitespace(second)));
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->role, control::ROLE_ADMIN);
  EXPECT_TRUE(access_->Authenticate(std::string(absl::StripTrailingAsciiWhitespace(first))).ok());
}

TEST_F(AccessTest, EnsureAdminToken_OnlyAdminRevoked_MintsANewOne) {
  ASSERT_TRUE(EnsureAdminToken(*store_, dir_).ok());
  ASSERT_TRUE(store_->RevokeToken("admin", absl::Now()).ok());
  absl::StatusOr<std::string> line = EnsureAdminToken(*store_, dir_);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("admin token 'admin2'"));
}

TEST_F(AccessTest, EnsureAdminToken_NameAdminTakenByAViewToken_MintsAdmin2) {
  ASSERT_TRUE(access_->Mint("admin", control::ROLE_VIEW).ok());
  absl::StatusOr<std::string> line = EnsureAdminToken(*store_, dir_);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("admin token 'admin2'"));
}

TEST_F(AccessTest, EnsureAdminToken_GroupWritableDir_IsRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0770), 0);
  absl::StatusOr<std::string> line = EnsureAdminToken(*store_, dir_);
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(line.status().message()), HasSubstr("chmod go-w"));
  EXPECT_NE(::access((dir_ + "/admin.token").c_str(), F_OK), 0);
}

// A FIFO as --token_file is refused at once rather than blocking open() until a writer comes. (A
// reader left waiting is released after 10 s by opening the other end, and the test fails.)
TEST(ReadTokenFileTest, ReadTokenFile_Fifo_RefusedAtOnce) {
  const std::string path = TempPath();
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto result = std::async(std::launch::async, [&] { return ReadTokenFile(path); });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "still waiting on the FIFO after 10 s";
    const int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  absl::StatusOr<TokenFile> file = result.get();
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("--token_file=" + path + ": not a regular file but a FIFO"));
}

TEST(ReadTokenFileTest, ReadTokenFile_WhitespaceAround_IsTrimmed) {
  const std::string path = TempPath();
  WriteFile(path, "  sh_abc \n\n", 0600);
  absl::StatusOr<TokenFile> file = ReadTokenFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->token, "sh_abc");
  EXPECT_EQ(file->warning, "");
}

TEST(ReadTokenFileTest, ReadTokenFile_ReadableByOthers_WarnsButReads) {
  const std::string path = TempPath();
  WriteFile(path, "sh_abc\n", 0644);
  absl::StatusOr<TokenFile> file = ReadTokenFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->token, "sh_abc");
  EXPECT_THAT(file->warning, HasSubstr("can be read by others (mode 0644); chmod 600"));
}

TEST(ReadTokenFileTest, ReadTokenFile_EmptyMissingOrTwoWords_IsRefused) {
  const std::string path = TempPath();
  WriteFile(path, " \n", 0600);
  absl::StatusOr<TokenFile> empty = ReadTokenFile(path);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr(": empty"));
  WriteFile(path, "sh_a sh_b\n", 0600);
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTokenFile(path + ".missing").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagehand
