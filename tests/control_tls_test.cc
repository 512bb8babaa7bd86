// The control server and client over TLS with certificates made at test time by openssl: mutual TLS
// works, and each way of getting it wrong (a foreign client certificate, none, plaintext against TLS
// and back, a certificate without the address as a subjectAltName, bad PEM files) fails with a line
// that says what to check.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "gtest/gtest.h"
#include "client/control_client.h"
#include "launcher/serve/control_service.h"
#include "launcher/serve/fake_job_service.h"

namespace stagehand {
namespace {

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/tls");
}
std::string F(const std::string& name) { return absl::StrCat(Dir(), "/", name); }

bool Sh(const std::string& command) {
  return std::system(absl::StrCat("cd ", Dir(), " && (", command, ") >>openssl.log 2>&1").c_str()) == 0;
}

// A CA, and leaves signed by it with `san` as their subjectAltName.
bool MakeCa(const std::string& ca) {
  return Sh(absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -keyout ", ca, ".key -out ", ca,
                         ".pem -subj /CN=", ca, " -days 2"));
}
bool MakeLeaf(const std::string& ca, const std::string& leaf, const std::string& san) {
  std::ofstream(F(leaf + ".ext")) << (san.empty() ? "" : "subjectAltName=" + san + "\n")
                                  << "extendedKeyUsage=serverAuth,clientAuth\n";
  return Sh(absl::StrCat("openssl req -newkey rsa:2048 -nodes -keyout ", leaf, ".key -out ", leaf,
                         ".csr -subj /CN=", leaf, " && openssl x509 -req -in ", leaf, ".csr -CA ", ca, ".pem -CAkey ",
                         ca, ".key -CAcreateserial -out ", leaf, ".pem -days 2 -extfile ", leaf, ".ext"));
}

class ControlTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", Dir()).c_str()), 0);
    ASSERT_TRUE(MakeCa("ca") && MakeCa("other_ca")) << F("openssl.log");
    ASSERT_TRUE(MakeLeaf("ca", "server", "IP:127.0.0.1,DNS:localhost"));
    ASSERT_TRUE(MakeLeaf("ca", "server_no_san", ""));
    ASSERT_TRUE(MakeLeaf("ca", "client", ""));
    ASSERT_TRUE(MakeLeaf("other_ca", "stranger", ""));
    std::ofstream(F("empty.pem")).flush();
    std::ofstream(F("text.pem")) << "hello\n";
  }
  void SetUp() override {
    fake_.AddToken("t", "alice", control::ROLE_VIEW);
    fake_.AddJob("j");
  }
  std::unique_ptr<ControlServer> Start(const std::string& cert, bool mutual) {
    ControlServerOptions options;
    options.listen = "127.0.0.1:0";
    if (!cert.empty()) {
      options.tls_cert = F(cert + ".pem");
      options.tls_key = F(cert + ".key");
    }
    if (mutual) options.tls_client_ca = F("ca.pem");
    auto server = ControlServer::Start(options, &fake_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  // GetJob through a client with these files (names under Dir(), "" for none).
  absl::Status Call(const ControlServer& server, const std::string& ca, const std::string& cert) {
    ControlClientOptions options;
    options.server = server.address();
    options.token = "t";
    if (!ca.empty()) options.tls.ca = F(ca + ".pem");
    if (!cert.empty()) {
      options.tls.cert = F(cert + ".pem");
      options.tls.key = F(cert + ".key");
    }
    auto client = ControlClient::Create(options);
    if (!client.ok()) return client.status();
    return (*client)->Get("j").status();
  }

  FakeJobService fake_;
};

TEST_F(ControlTlsTest, MutualTls_SignedClient_Works) {
  auto server = Start("server", true);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Call(*server, "ca", "client").ok()) << Call(*server, "ca", "client");
}

TEST_F(ControlTlsTest, ServerInfo_MutualTls_SaysSo) {
  auto server = Start("server", true);
  ASSERT_NE(server, nullptr);
  ControlClientOptions options;
  options.server = server->address();
  options.tls = {F("ca.pem"), F("client.pem"), F("client.key")};
  auto info = (*ControlClient::Create(options))->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->tls() && info->mutual_tls());
}

TEST_F(ControlTlsTest, MutualTls_ClientCertificateOfAnotherCa_FailsWithHandshakeHint) {
  auto server = Start("server", true);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "ca", "stranger");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(
      s.message(), absl::StrCat("the TLS handshake with ", server->address(), " failed: check that --tls_ca")))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--tls_client_ca")) << s;
}

TEST_F(ControlTlsTest, MutualTls_NoClientCertificate_FailsWithHandshakeHint) {
  auto server = Start("server", true);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "ca", "");
  EXPECT_TRUE(absl::StrContains(s.message(), "the TLS handshake with")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "pass --tls_cert and --tls_key")) << s;
}

TEST_F(ControlTlsTest, Tls_ServerSignedByAnotherCa_FailsWithHandshakeHint) {
  auto server = Start("server", false);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "other_ca", "");
  EXPECT_TRUE(absl::StrContains(s.message(), "its certificate is not signed by --tls_ca")) << s;
}

TEST_F(ControlTlsTest, PlaintextClient_TlsServer_FailsSayingPassTlsCa) {
  auto server = Start("server", false);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "pass --tls_ca=FILE")) << s;
}

TEST_F(ControlTlsTest, TlsClient_PlaintextServer_FailsSayingItDoesNotSpeakTls) {
  auto server = Start("", false);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "ca", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "does not speak TLS")) << s;
}

TEST_F(ControlTlsTest, Tls_CertificateWithoutIpSan_FailsNamingSubjectAltName) {
  auto server = Start("server_no_san", false);
  ASSERT_NE(server, nullptr);
  absl::Status s = Call(*server, "ca", "");
  EXPECT_TRUE(absl::StrContains(s.message(), "does not name 127.0.0.1 as a subjectAltName")) << s;
}

TEST_F(ControlTlsTest, NoServer_FailsSayingNoServerAt) {
  ControlClientOptions options;
  options.server = "127.0.0.1:1";
  options.token = "t";
  absl::Status s = (*ControlClient::Create(options))->Get("j").status();
  EXPECT_TRUE(absl::StrContains(s.message(), "no server at 127.0.0.1:1: is `launcher --serve` running there?")) << s;
}

TEST(ReadPemFileTest, BadFiles_AreInvalidArgumentNamingPathAndWhat) {
  struct Case {
    std::string path, expected;
    PemKind kind;
  } cases[] = {
      {F("missing.pem"), "cannot read it", PemKind::kCertificates},
      {F("empty.pem"), "the file is empty", PemKind::kCertificates},
      {F("text.pem"), "not PEM", PemKind::kCertificates},
      {F("ca.key"), "holds no valid PEM certificate", PemKind::kCertificates},
      {F("ca.pem"), "holds no valid unencrypted PEM private key", PemKind::kPrivateKey},
      {Dir(), "not a regular file but a directory", PemKind::kCertificates},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> pem = ReadPemFile("--tls_cert", c.path, c.kind);
    EXPECT_EQ(pem.status().code(), absl::StatusCode::kInvalidArgument) << c.path;
    EXPECT_TRUE(absl::StrContains(pem.status().message(), absl::StrCat("--tls_cert=", c.path, ": ", c.expected)))
        << pem.status();
  }
}

TEST_F(ControlTlsTest, Start_KeyOfAnotherCertificate_IsInvalidArgument) {
  ControlServerOptions options;
  options.listen = "127.0.0.1:0";
  options.tls_cert = F("server.pem");
  options.tls_key = F("client.key");
  auto server = ControlServer::Start(options, &fake_);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "is not the private key of --tls_cert=")) << server.status();
}

TEST_F(ControlTlsTest, Start_NonLoopbackWithTls_IsAllowed) {
  ControlServerOptions options;
  options.listen = "0.0.0.0:0";
  options.tls_cert = F("server.pem");
  options.tls_key = F("server.key");
  auto server = ControlServer::Start(options, &fake_);
  EXPECT_TRUE(server.ok()) << server.status();
}

}  // namespace
}  // namespace stagehand
