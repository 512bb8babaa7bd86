// PEM files, gRPC TLS credentials and the explanation of failed calls (see tls.h).
#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/input_file.h"
#include "grpcpp/security/credentials.h"

namespace stagehand {
namespace {

absl::Status Bad(const std::string& flag, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": ", what));
}

// OpenSSL's own reading of the text: the checks a TLS library would make only at the first handshake.
bool ParsesAs(const std::string& pem, PemKind kind) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return false;
  bool ok = false;
  if (kind == PemKind::kCertificates) {
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    ok = cert != nullptr;
    X509_free(cert);
  } else {
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    ok = key != nullptr;
    EVP_PKEY_free(key);
  }
  BIO_free(bio);
  ERR_clear_error();
  return ok;
}

// Whether `key_pem` is the private key of the first certificate of `cert_pem` (both already parsed).
bool KeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem) {
  BIO* cbio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* kbio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  X509* cert = cbio ? PEM_read_bio_X509(cbio, nullptr, nullptr, nullptr) : nullptr;
  EVP_PKEY* key = kbio ? PEM_read_bio_PrivateKey(kbio, nullptr, nullptr, nullptr) : nullptr;
  const bool ok = cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  BIO_free(cbio);
  BIO_free(kbio);
  ERR_clear_error();
  return ok;
}

// A certificate and its key, both read and checked against each other.
absl::StatusOr<grpc::SslServerCredentialsOptions::PemKeyCertPair> ReadKeyPair(const std::string& cert_flag,
                                                                              const std::string& cert,
                                                                              const std::string& key_flag,
                                                                              const std::string& key) {
  absl::StatusOr<std::string> cert_pem = ReadPemFile(cert_flag, cert, PemKind::kCertificates);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile(key_flag, key, PemKind::kPrivateKey);
  if (!key_pem.ok()) return key_pem.status();
  if (!KeyMatchesCertificate(*cert_pem, *key_pem)) {
    return absl::InvalidArgumentError(absl::StrCat(key_flag, "=", key, " is not the private key of ", cert_flag, "=",
                                                   cert, ": pass the key the certificate was made for"));
  }
  return grpc::SslServerCredentialsOptions::PemKeyCertPair{*std::move(key_pem), *std::move(cert_pem)};
}

bool Has(const grpc::Status& s, absl::string_view text) { return absl::StrContains(s.error_message(), text); }

// The failures of the connection itself (UNAVAILABLE), which gRPC reports in its transport's words.
std::string ExplainUnavailable(const grpc::Status& s, const ClientTlsInfo& info) {
  const std::string& server = info.server;
  if (Has(s, "Connection refused")) {
    return absl::StrCat("no server at ", server, ": is `launcher --serve` running there? (check --server)");
  }
  if (Has(s, "not in peer certificate")) {
    const std::string host = server.substr(0, server.rfind(':'));
    return absl::StrCat("the server's certificate does not name ", host,
                        " as a subjectAltName: make it with subjectAltName=IP:", host,
                        " (or DNS:<name>), or dial the server by a name its certificate has");
  }
  if (info.tls && Has(s, "certificate verify failed")) {
    return absl::StrCat("the TLS handshake with ", server, " failed: its certificate is not signed by --tls_ca; pass ",
                        "the CA that signed the server's certificate");
  }
  if (info.tls && (Has(s, "WRONG_VERSION_NUMBER") || Has(s, "wrong version number") ||
                   Has(s, "packet length too long") || Has(s, "http request"))) {
    return absl::StrCat("the server at ", server, " does not speak TLS: drop --tls_ca, --tls_cert and --tls_key ",
                        "(a loopback server may be plaintext)");
  }
  const bool closed = Has(s, "Socket closed") || Has(s, "Connection reset") || Has(s, "connection reset") ||
                      Has(s, "Broken pipe") || Has(s, "GOAWAY") || Has(s, "closed");
  const bool handshake = Has(s, "andshake") || Has(s, "SSL") || Has(s, "ssl") || Has(s, "certificate");
  if (info.tls && (closed || handshake)) {
    return absl::StrCat(
        "the TLS handshake with ", server,
        " failed: check that --tls_ca is the CA that signed the server's certificate and, for "
        "mutual TLS, that --tls_cert is signed by the CA the server trusts (--tls_client_ca)",
        info.client_cert ? "" : "; the server may require a client certificate: pass --tls_cert and --tls_key", " (",
        s.error_message(), ")");
  }
  if (!info.tls && closed) {
    return absl::StrCat("the server at ", server, " closed the connection before any reply: if it uses TLS (a ",
                        "non-loopback server always does), pass --tls_ca=FILE, the CA that signed its certificate ",
                        "(and --tls_cert/--tls_key for mutual TLS)");
  }
  return absl::StrCat("cannot reach the server at ", server, ": ", s.error_message(), " (check --server)");
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path, PemKind kind) {
  // A regular file only (common/input_file.h): a FIFO would block open() until a writer came.
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, "");
  if (!file.ok()) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return Bad(flag, path, absl::StrCat("not a regular file but ", FileKind(st.st_mode), "; pass a PEM file"));
    }
    return Bad(flag, path, absl::StripPrefix(file.status().message(), ": "));
  }
  if (file->st.st_size > (int64_t{1} << 20)) return Bad(flag, path, "more than 1 MiB: not a PEM file");
  std::string pem(static_cast<size_t>(file->st.st_size), '\0');
  ssize_t n;
  while ((n = ::pread(file->fd.get(), pem.data(), pem.size(), 0)) < 0 && errno == EINTR) {
  }
  if (n < 0) return Bad(flag, path, absl::StrCat("cannot read it: ", std::strerror(errno)));
  pem.resize(static_cast<size_t>(n));
  if (absl::StripAsciiWhitespace(pem).empty()) return Bad(flag, path, "the file is empty; pass a PEM file");
  const bool want_cert = kind == PemKind::kCertificates;
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return Bad(flag, path,
               absl::StrCat("not PEM (no -----BEGIN line); pass a PEM ", want_cert ? "certificate" : "private key",
                            " (openssl x509 -outform PEM)"));
  }
  if (!ParsesAs(pem, kind)) {
    return Bad(flag, path,
               want_cert ? "holds no valid PEM certificate (-----BEGIN CERTIFICATE-----)"
                         : "holds no valid unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)");
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(const ServerTlsFiles& files) {
  absl::StatusOr<grpc::SslServerCredentialsOptions::PemKeyCertPair> pair =
      ReadKeyPair("--tls_cert", files.cert, "--tls_key", files.key);
  if (!pair.ok()) return pair.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back(*std::move(pair));
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile("--tls_client_ca", files.client_ca, PemKind::kCertificates);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(const ClientTlsFiles& files) {
  if (files.ca.empty() && files.cert.empty() && files.key.empty()) return grpc::InsecureChannelCredentials();
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: pass both (a client certificate and its key) or neither");
  }
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile("--tls_ca", files.ca, PemKind::kCertificates);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!files.cert.empty()) {
    auto pair = ReadKeyPair("--tls_cert", files.cert, "--tls_key", files.key);
    if (!pair.ok()) return pair.status();
    options.pem_cert_chain = std::move(pair->cert_chain);
    options.pem_private_key = std::move(pair->private_key);
  }
  return grpc::SslCredentials(options);
}

absl::Status ExplainRpcError(const grpc::Status& s, const ClientTlsInfo& info) {
  if (s.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      // The server's own UNAVAILABLE (shutting down) already says what to do.
      if (Has(s, "shutting down")) return absl::Status(code, s.error_message());
      return absl::Status(code, ExplainUnavailable(s, info));
    case grpc::StatusCode::UNAUTHENTICATED:
      if (Has(s, "--token_file")) return absl::Status(code, s.error_message());
      return absl::Status(code, absl::StrCat("the server refused the token (", s.error_message(),
                                             "): ask its admin for one, or pass --token_file"));
    case grpc::StatusCode::CANCELLED:
      // A server that is shutting down cancels the calls still open (a submission being checked).
      return absl::Status(
          code, absl::StrCat("the server at ", info.server, " ended the call before answering (", s.error_message(),
                             "), as one that is shutting down does: run the "
                             "command again once it is back"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::Status(code, absl::StrCat("the server at ", info.server, " did not answer in time (",
                                             s.error_message(), "): check that it is up and reachable"));
    default:
      return absl::Status(code, s.error_message());
  }
}

}  // namespace stagehand
