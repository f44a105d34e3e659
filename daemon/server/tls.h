// Transport security of the daemon's gRPC port and of its calls to peers: TLS, client
// certificates required and verified (mTLS), and certificates re-read when their files
// change, a bad new pair refused with the old one kept.
#ifndef GPUMOVE_DAEMON_SERVER_TLS_H_
#define GPUMOVE_DAEMON_SERVER_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/common/watched_files.h"

namespace gpumove {

struct TlsOptions {
  // PEM files: the server's certificate chain and its private key. Empty: plaintext.
  std::string cert;
  std::string key;
  // A PEM bundle of CAs; set: every client presents a certificate one of them signed.
  std::string client_ca;
  // How often the files are looked at for a change.
  absl::Duration refresh = absl::Seconds(1);
};

// What is wrong with a certificate chain and private key in PEM (unreadable, not PEM, the
// key not the certificate's, the certificate outside its validity period); OK when the
// pair is usable.
absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem);
// What is wrong with a PEM bundle of CA certificates (none in it, one that does not parse).
absl::Status CheckCaBundle(const std::string& pem);

// The server's certificates, watched. gRPC's own file watcher reads a private copy that
// this watcher replaces only with a pair that passed CheckKeyPair (and a CA bundle that
// passed CheckCaBundle), both files at once.
class TlsFiles {
 public:
  // INVALID_ARGUMENT for options that do not make sense together (a key without a
  // certificate, a client CA without either), or files that do not pass the checks.
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Start(const TlsOptions& options);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }

 private:
  explicit TlsFiles(TlsOptions options) : options_(std::move(options)) {}
  // The watched files' new contents (certificate, key and the CA bundle when there is
  // one): published when they pass the checks.
  absl::Status Apply(const std::vector<std::string>& contents);
  absl::Status Publish(const std::string& cert, const std::string& key, const std::string& ca);

  const TlsOptions options_;
  std::string dir_;  // Private (0700): what gRPC reads, under "current".
  int generation_ = 0;  // Only the watcher's thread publishes.
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<WatchedFiles> watcher_;  // Last: it stops before the rest goes.
};

// The files of PeerChannelCredentials.
struct PeerTlsOptions {
  std::string ca;
  std::string cert;
  std::string key;
  // The name every peer's certificate must carry (--peer_tls_server_name), checked instead
  // of the host in the address dialled: one certificate for all nodes reached by IP
  // (Kubernetes pods). Empty: the address's host.
  std::string server_name;
};

// Credentials for calls to peers: TLS verifying the peer's certificate against the PEM
// bundle `ca` (a file), presenting `cert`/`key` (files, may be empty) as this node's
// certificate for peers that require one. All empty: plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const std::string& ca, const std::string& cert, const std::string& key);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_TLS_H_
