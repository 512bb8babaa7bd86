// TLS for the control service and its client over gRPC 1.51's classic credentials: PEM files read
// and checked with errors that name the flag and the path, and the opaque failures of a TLS (or
// plaintext) connection turned into lines that say what to check.
#ifndef STAGEHAND_COMMON_TLS_H_
#define STAGEHAND_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/status.h"

namespace stagehand {

enum class PemKind { kCertificates, kPrivateKey };

// The text of a PEM file, checked with OpenSSL: it exists, is not empty and holds at least one
// certificate (kCertificates) or a private key (kPrivateKey). INVALID_ARGUMENT naming `flag`
// (e.g. "--tls_cert"), the path and what is wrong, so that a bad file is refused before binding.
absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path, PemKind kind);

// The server's side: a certificate chain and its key; with `client_ca`, mutual TLS (a client must
// present a certificate that CA signed).
struct ServerTlsFiles {
  std::string cert, key, client_ca;  // paths
};

// INVALID_ARGUMENT for an unreadable or invalid file, or a key that does not match the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(const ServerTlsFiles& files);

// The client's side: --tls_ca (the CA that signed the server's certificate; TLS on), --tls_cert and
// --tls_key (a client certificate, for mutual TLS). All empty: plaintext.
struct ClientTlsFiles {
  std::string ca, cert, key;  // paths
};

// InsecureChannelCredentials when every file is empty; SslCredentials otherwise (with no --tls_ca,
// gRPC's default roots). INVALID_ARGUMENT for a bad file or a --tls_cert without --tls_key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(const ClientTlsFiles& files);

// What ExplainRpcError needs to know about the connection.
struct ClientTlsInfo {
  std::string server;        // HOST:PORT, for messages
  bool tls = false;          // the client speaks TLS
  bool client_cert = false;  // and presents a certificate (mutual TLS)
};

// A failed call's status with a message that says what to check: connection refused, a TLS
// handshake that failed, TLS against plaintext (either way), a certificate without the address as a
// subjectAltName, a refused token. The code is the call's own (UNAVAILABLE stays retryable). OK for OK.
absl::Status ExplainRpcError(const grpc::Status& status, const ClientTlsInfo& info);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_TLS_H_
