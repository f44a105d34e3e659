#include "daemon/server/field_limits.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace gpumove {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

size_t LimitOf(const FieldDescriptor& f) {
  if (f.name() == "label") return kMaxLabelBytes;
  if (f.name() == "idempotency_key") return kMaxIdempotencyKeyBytes;
  return kMaxStringFieldBytes;
}

absl::Status Check(const Message& m, const std::string& path, int depth) {
  if (depth > 32) return absl::InvalidArgumentError("a request nested more than 32 deep");
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string at = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      const size_t limit = LimitOf(*f);
      const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
      for (int i = 0; i < n; ++i) {
        std::string scratch;
        const std::string& s = f->is_repeated() ? r->GetRepeatedStringReference(m, f, i, &scratch)
                                                : r->GetStringReference(m, f, &scratch);
        if (s.size() > limit) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, f->is_repeated() ? absl::StrCat("[", i, "]") : "", " has ",
                           s.size(), " bytes; at most ", limit));
        }
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0, n = r->FieldSize(m, f); i < n; ++i) {
          absl::Status st =
              Check(r->GetRepeatedMessage(m, f, i), absl::StrCat(at, "[", i, "]"), depth + 1);
          if (!st.ok()) return st;
        }
      } else {
        absl::Status st = Check(r->GetMessage(m, f), at, depth + 1);
        if (!st.ok()) return st;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStringFields(const Message& request) { return Check(request, "", 0); }

}  // namespace gpumove
