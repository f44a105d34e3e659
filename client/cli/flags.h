// gpumovectl's flags: defined in flags.cc, read by every command file.
#ifndef GPUMOVE_CLIENT_CLI_FLAGS_H_
#define GPUMOVE_CLIENT_CLI_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, addr);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, kind);
ABSL_DECLARE_FLAG(int, gpu);
ABSL_DECLARE_FLAG(absl::Duration, lease);
ABSL_DECLARE_FLAG(std::string, label);
ABSL_DECLARE_FLAG(bool, exportable);
ABSL_DECLARE_FLAG(std::string, node);
ABSL_DECLARE_FLAG(std::string, offset);
ABSL_DECLARE_FLAG(std::string, length);
ABSL_DECLARE_FLAG(bool, checksum);
ABSL_DECLARE_FLAG(bool, wait);
ABSL_DECLARE_FLAG(std::string, path);
ABSL_DECLARE_FLAG(std::string, priority);
ABSL_DECLARE_FLAG(std::string, require);
ABSL_DECLARE_FLAG(std::string, root);
ABSL_DECLARE_FLAG(bool, writable);
ABSL_DECLARE_FLAG(bool, create);
ABSL_DECLARE_FLAG(std::string, idempotency_key);
ABSL_DECLARE_FLAG(std::string, blocks);
ABSL_DECLARE_FLAG(std::string, block_size);
ABSL_DECLARE_FLAG(std::string, source_stride);
ABSL_DECLARE_FLAG(std::string, destination_stride);
ABSL_DECLARE_FLAG(std::string, prepared);
ABSL_DECLARE_FLAG(std::optional<std::string>, notify);
ABSL_DECLARE_FLAG(std::string, buffers);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, after);
ABSL_DECLARE_FLAG(int, count);
ABSL_DECLARE_FLAG(std::string, state);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, gpu_uuid);
ABSL_DECLARE_FLAG(int, pid);

#endif  // GPUMOVE_CLIENT_CLI_FLAGS_H_
