// Certificates for TLS tests, made with the openssl command in a directory of the test's.
#ifndef GPUMOVE_TESTS_UTIL_TEST_CERTS_H_
#define GPUMOVE_TESTS_UTIL_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace gpumove {

struct CertFiles {
  std::string cert;  // PEM files.
  std::string key;
};

// Whether the openssl command runs here (tests say SKIPPED without it).
bool HaveOpenssl();

// A self-signed CA named `name` in `dir`.
absl::StatusOr<CertFiles> MakeCa(const std::string& dir, const std::string& name);
// A certificate for `name` signed by `ca`, valid for 127.0.0.1 and localhost (a server's
// and a client's alike); `days` < 0 makes one that has expired. `san`: its
// subjectAltName instead (e.g. "DNS:peers.test").
absl::StatusOr<CertFiles> MakeCert(const std::string& dir, const CertFiles& ca,
                                   const std::string& name, int days = 2,
                                   const std::string& san = "");

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_TEST_CERTS_H_
