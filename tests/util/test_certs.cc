#include "tests/util/test_certs.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

absl::Status Run(const std::string& command) {
  const std::string quiet = absl::StrCat(command, " >/dev/null 2>&1");
  if (std::system(quiet.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("failed: ", command));
  }
  return absl::OkStatus();
}

constexpr char kKey[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

}  // namespace

bool HaveOpenssl() { return std::system("openssl version >/dev/null 2>&1") == 0; }

absl::StatusOr<CertFiles> MakeCa(const std::string& dir, const std::string& name) {
  CertFiles ca{absl::StrCat(dir, "/", name, ".pem"), absl::StrCat(dir, "/", name, ".key")};
  absl::Status st = Run(absl::StrCat("openssl req -x509 ", kKey, " -keyout ", ca.key, " -out ",
                                     ca.cert, " -days 2 -subj /CN=", name));
  if (!st.ok()) return st;
  return ca;
}

absl::StatusOr<CertFiles> MakeCert(const std::string& dir, const CertFiles& ca,
                                   const std::string& name, int days, const std::string& san) {
  CertFiles c{absl::StrCat(dir, "/", name, ".pem"), absl::StrCat(dir, "/", name, ".key")};
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  {
    std::ofstream out(ext);
    if (san.empty()) {
      out << "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:" << name << "\n";
    } else {
      out << "subjectAltName=" << san << "\n";
    }
  }
  absl::Status st = Run(
      absl::StrCat("openssl req ", kKey, " -keyout ", c.key, " -out ", csr, " -subj /CN=", name));
  if (st.ok()) {
    st = Run(absl::StrCat("openssl x509 -req -in ", csr, " -CA ", ca.cert, " -CAkey ", ca.key,
                          " -CAcreateserial -out ", c.cert, " -days ", days, " -extfile ", ext));
  }
  if (!st.ok()) return st;
  return c;
}

}  // namespace gpumove
