#include "daemon/server/tls.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"

namespace gpumove {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// An encrypted key is refused rather than prompting for a passphrase.
int NoPassphrase(char*, int, int, void*) { return -1; }

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return absl::StrCat(" (", buf, ")");
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  if (chmod(path.c_str(), 0600) != 0) return absl::InternalError(absl::StrCat("chmod ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem) {
  ERR_clear_error();
  Bio cert_bio = MemoryBio(cert_pem);
  Cert cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate is not a PEM certificate", OpenSslError()));
  }
  Bio key_bio = MemoryBio(key_pem);
  Pkey key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, &NoPassphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the key is not an unencrypted PEM private key", OpenSslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the key is not the certificate's");
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError("the certificate is not valid yet");
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError("the certificate has expired");
  }
  return absl::OkStatus();
}

absl::Status CheckCaBundle(const std::string& pem) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  int parsed = 0;
  while (Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) != nullptr) ++parsed;
  ERR_clear_error();  // The end of the bundle reads as an error.
  size_t present = 0;
  for (size_t at = pem.find("-----BEGIN CERTIFICATE-----"); at != std::string::npos;
       at = pem.find("-----BEGIN CERTIFICATE-----", at + 1)) {
    ++present;
  }
  if (parsed == 0) return absl::InvalidArgumentError("no PEM certificate in the CA bundle");
  if (static_cast<size_t>(parsed) != present) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", parsed + 1, " of ", present,
                                                   " in the CA bundle does not parse"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Start(const TlsOptions& options) {
  if (options.cert.empty() != options.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.cert.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  std::unique_ptr<TlsFiles> files(new TlsFiles(options));
  const char* tmp = getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/gpumoved-tls-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a private directory ", dir));
  }
  files->dir_ = dir;
  std::vector<std::string> paths = {options.cert, options.key};
  if (!options.client_ca.empty()) paths.push_back(options.client_ca);
  TlsFiles* self = files.get();
  auto watcher = WatchedFiles::Start(
      std::move(paths), options.refresh, "new TLS files",
      [self](const std::vector<std::string>& contents) { return self->Apply(contents); });
  if (!watcher.ok()) return watcher.status();
  files->watcher_ = *std::move(watcher);
  const std::string current = absl::StrCat(files->dir_, "/current/");
  const unsigned refresh =
      static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(options.refresh)));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (options.client_ca.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        current + "key.pem", current + "cert.pem", refresh);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        current + "key.pem", current + "cert.pem", current + "ca.pem", refresh);
  }
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options.client_ca.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  files->credentials_ = grpc::experimental::TlsServerCredentials(tls);
  if (files->credentials_ == nullptr) return absl::InternalError("gRPC made no TLS credentials");
  return files;
}

TlsFiles::~TlsFiles() {
  watcher_.reset();  // No publishing from here on.
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

absl::Status TlsFiles::Apply(const std::vector<std::string>& contents) {
  const std::string& cert = contents[0];
  const std::string& key = contents[1];
  const std::string ca = contents.size() > 2 ? contents[2] : "";
  absl::Status st = CheckKeyPair(cert, key);
  if (st.ok() && !options_.client_ca.empty()) st = CheckCaBundle(ca);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(options_.cert, " / ", options_.key,
                                                   options_.client_ca.empty() ? "" : " / ",
                                                   options_.client_ca, ": ", st.message()));
  }
  return Publish(cert, key, ca);
}

absl::Status TlsFiles::Publish(const std::string& cert, const std::string& key,
                               const std::string& ca) {
  // Each pair in a directory of its own; "current" is a link swapped in one rename, so
  // that gRPC never reads one pair's key with another's certificate.
  const std::string gen = absl::StrCat("gen-", ++generation_);
  const std::string path = absl::StrCat(dir_, "/", gen);
  if (mkdir(path.c_str(), 0700) != 0) return absl::InternalError(absl::StrCat("mkdir ", path));
  const std::pair<const char*, const std::string*> files[] = {
      {"cert.pem", &cert}, {"key.pem", &key}, {"ca.pem", &ca}};
  for (const auto& [name, contents] : files) {
    GPUMOVE_RETURN_IF_ERROR(WriteFile(absl::StrCat(path, "/", name), *contents));
  }
  const std::string link = absl::StrCat(dir_, "/current.new");
  unlink(link.c_str());
  if (symlink(gen.c_str(), link.c_str()) != 0 ||
      rename(link.c_str(), absl::StrCat(dir_, "/current").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot publish certificates in ", dir_));
  }
  // The pair before the last may still be read by a handshake that began before the swap.
  if (generation_ > 2) {
    std::error_code ignored;
    std::filesystem::remove_all(absl::StrCat(dir_, "/gen-", generation_ - 2), ignored);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(
    const std::string& ca, const std::string& cert, const std::string& key) {
  if (ca.empty() && cert.empty() && key.empty()) return grpc::InsecureChannelCredentials();
  if (ca.empty()) return absl::InvalidArgumentError("--peer_tls_cert/key need --peer_tls_ca");
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--peer_tls_cert and --peer_tls_key go together");
  }
  grpc::SslCredentialsOptions ssl;
  auto roots = ReadWholeFile(ca, "peer CA bundle");
  if (!roots.ok()) return roots.status();
  if (absl::Status st = CheckCaBundle(*roots); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(ca, ": ", st.message()));
  }
  ssl.pem_root_certs = *roots;
  if (!cert.empty()) {
    auto c = ReadWholeFile(cert, "peer certificate");
    auto k = ReadWholeFile(key, "peer key");
    if (!c.ok()) return c.status();
    if (!k.ok()) return k.status();
    if (absl::Status st = CheckKeyPair(*c, *k); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(cert, " / ", key, ": ", st.message()));
    }
    ssl.pem_cert_chain = *c;
    ssl.pem_private_key = *k;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace gpumove
