#include "daemon/common/status_macros.h"
#include "daemon/path/ucx/ucx_wire_check.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// The constants of UCX's src/ucp/wireup/address.c and ucp_rkey.c (not installed headers).
constexpr uint8_t kVersionV1 = 0, kVersionV2 = 1;
constexpr uint8_t kHeaderDebugInfo = 1 << 0, kHeaderWorkerUuid = 1 << 1, kHeaderClientId = 1 << 2;
constexpr uint8_t kNullResource = 0xff;
constexpr uint8_t kFlagLast = 0x80, kFlagHasEpAddr = 0x40;      // Iface length byte.
constexpr uint8_t kFlagNumPaths = 0x40, kFlagSysDevice = 0x20;  // Device length byte.
constexpr uint8_t kMdEmptyDev = 0x80;
constexpr uint8_t kMdMaskV1 = 0x1f, kMdMaskV2 = 0x7f;
constexpr uint8_t kDeviceLenMask = 0x1f;
constexpr uint8_t kIfaceLenMask = 0x3f;
constexpr size_t kIfaceAttrV1 = 16, kIfaceAttrV2 = 8;  // Packed iface attributes.
constexpr int kMaxResources = 128, kMaxLanes = 64, kMaxMds = 64;
constexpr unsigned kMemoryTypes = 16;  // ucs_memory_type_t values are below this.

// Reads a buffer front to back; every read is bounded by its end.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  bool Byte(uint8_t* out) {
    if (pos_ >= bytes_.size()) return false;
    *out = static_cast<uint8_t>(bytes_[pos_++]);
    return true;
  }
  bool Peek(uint8_t* out) const {
    if (pos_ >= bytes_.size()) return false;
    *out = static_cast<uint8_t>(bytes_[pos_]);
    return true;
  }
  bool Skip(size_t n) {
    if (n > bytes_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  bool U64(uint64_t* out) {
    if (bytes_.size() - pos_ < sizeof(*out)) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(*out));
    pos_ += sizeof(*out);
    return true;
  }
  // A value in the low bits of a byte (`mask`); in version 2 a value equal to the mask
  // means the real one follows in the next byte.
  bool Extended(uint8_t mask, uint8_t version, uint8_t* value, uint8_t* flags) {
    uint8_t b = 0;
    if (!Byte(&b)) return false;
    *flags = b & ~mask;
    *value = b & mask;
    if (version != kVersionV1 && *value == mask) return Byte(value);
    return true;
  }
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Bad(const char* what, const Reader& r) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed UCX worker address: ", what, " at byte ", r.pos()));
}

}  // namespace

absl::StatusOr<std::vector<UcxAddressEntry>> ParseUcxWorkerAddress(absl::string_view address) {
  if (address.empty()) return absl::InvalidArgumentError("empty UCX worker address");
  if (address.size() > kMaxUcxWorkerAddress) {
    return absl::InvalidArgumentError(absl::StrCat("UCX worker address of ", address.size(),
                                                   " bytes; at most ", kMaxUcxWorkerAddress));
  }
  Reader r(address);
  uint8_t header = 0, flags = 0;
  r.Byte(&header);
  const uint8_t version = header & 0x0f;
  if (version == kVersionV1) {
    flags = header >> 4;
  } else if (version == kVersionV2) {
    if (!r.Byte(&flags)) return Bad("header cut short", r);
  } else {
    return Bad("unknown version", r);
  }
  // Version 1 always carries the worker's uuid (UCX unpacks it whenever it asks for it,
  // which ucp_ep_create does); version 2 says so in a flag.
  if ((version == kVersionV1 || (flags & kHeaderWorkerUuid)) && !r.Skip(8)) {
    return Bad("worker uuid cut short", r);
  }
  if ((flags & kHeaderClientId) && !r.Skip(8)) return Bad("client id cut short", r);
  if (flags & kHeaderDebugInfo) {
    uint8_t name = 0;
    if (!r.Byte(&name) || !r.Skip(name)) return Bad("worker name cut short", r);
  }
  uint8_t first = 0;
  if (!r.Peek(&first)) return Bad("no device list", r);
  if (first == kNullResource) {
    r.Skip(1);
    if (!r.done()) return Bad("bytes after an empty device list", r);
    return std::vector<UcxAddressEntry>{};
  }
  std::vector<UcxAddressEntry> entries;
  for (int devices = 0;; ++devices) {
    if (devices >= kMaxResources) return Bad("too many devices", r);
    uint8_t md_byte = 0, md = 0, md_flags = 0;
    if (!r.Peek(&md_byte)) return Bad("device cut short", r);
    const bool empty = md_byte & kMdEmptyDev;
    if (!r.Extended(version == kVersionV1 ? kMdMaskV1 : kMdMaskV2, version, &md, &md_flags)) {
      return Bad("device md index cut short", r);
    }
    if (md >= kMaxMds) return Bad("memory domain index out of range", r);
    uint8_t dev_len = 0, dev_flags = 0;
    if (!r.Extended(kDeviceLenMask, version, &dev_len, &dev_flags)) {
      return Bad("device address length cut short", r);
    }
    const bool last_device = dev_flags & kFlagLast;
    if ((dev_flags & kFlagNumPaths) && !r.Skip(1)) return Bad("path count cut short", r);
    if ((dev_flags & kFlagSysDevice) && !r.Skip(1)) return Bad("system device cut short", r);
    if (!r.Skip(dev_len)) return Bad("device address cut short", r);
    for (bool last_iface = empty; !last_iface;) {
      if (entries.size() >= kMaxResources) return Bad("too many interfaces", r);
      UcxAddressEntry e;
      e.device_length = dev_len;
      uint8_t lo = 0, hi = 0;
      if (!r.Byte(&lo) || !r.Byte(&hi)) return Bad("transport name checksum cut short", r);
      e.transport = static_cast<uint16_t>(lo | (hi << 8));
      if (!r.Skip(version == kVersionV1 ? kIfaceAttrV1 : kIfaceAttrV2)) {
        return Bad("interface attributes cut short", r);
      }
      uint8_t iface_len = 0, iface_flags = 0;
      if (!r.Extended(kIfaceLenMask, version, &iface_len, &iface_flags)) {
        return Bad("interface address length cut short", r);
      }
      last_iface = iface_flags & kFlagLast;
      e.iface_length = iface_len;
      if (!r.Skip(iface_len)) return Bad("interface address cut short", r);
      bool more = iface_flags & kFlagHasEpAddr;
      for (int eps = 0; more; ++eps) {
        if (eps >= kMaxLanes) return Bad("too many endpoint addresses", r);
        uint8_t ep_len = 0, lane = 0;
        if (!r.Byte(&ep_len) || !r.Skip(ep_len) || !r.Byte(&lane)) {
          return Bad("endpoint address cut short", r);
        }
        more = !(lane & kFlagLast);
        ++e.endpoints;
      }
      entries.push_back(e);
    }
    if (last_device) break;
  }
  if (!r.done()) return Bad("bytes after the last device", r);
  return entries;
}

absl::Status UcxAddressShape::Learn(absl::string_view own_address) {
  auto entries = ParseUcxWorkerAddress(own_address);
  if (!entries.ok()) return entries.status();
  for (const UcxAddressEntry& e : *entries) {
    known_.emplace_back(e.transport, e.device_length, e.iface_length);
  }
  return absl::OkStatus();
}

bool UcxAddressShape::Knows(uint16_t transport) const {
  for (const auto& k : known_) {
    if (std::get<0>(k) == transport) return true;
  }
  return false;
}

bool UcxAddressShape::Fits(const UcxAddressEntry& e) const {
  // At least the shortest lengths this node writes for the transport: UCX reads as much
  // as it needs from a device or interface address without looking at its length, and a
  // peer's may be longer (an IPv6 interface where this node has IPv4 ones).
  bool known = false;
  uint8_t device = 255, iface = 255;
  for (const auto& [transport, d, i] : known_) {
    if (transport != e.transport) continue;
    known = true;
    device = std::min(device, d);
    iface = std::min(iface, i);
  }
  return known && e.device_length >= device && e.iface_length >= iface;
}

absl::Status CheckUcxWorkerAddress(absl::string_view address, const UcxAddressShape* shape) {
  auto entries = ParseUcxWorkerAddress(address);
  if (!entries.ok()) return entries.status();
  if (shape == nullptr) return absl::OkStatus();
  for (const UcxAddressEntry& e : *entries) {
    if (!shape->Knows(e.transport)) continue;  // UCX finds no local transport for it.
    if (!shape->Fits(e) || e.endpoints != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed UCX worker address: transport ", e.transport, " with a ", e.device_length,
          "-byte device and a ", e.iface_length, "-byte interface address",
          e.endpoints != 0 ? " and endpoint addresses" : "", ", not as this node's UCX writes it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUcxRkey(absl::string_view rkey) {
  if (rkey.size() > kMaxUcxRkey) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX remote key of ", rkey.size(), " bytes; at most ", kMaxUcxRkey));
  }
  Reader r(rkey);
  uint64_t md_map = 0;
  uint8_t mem_type = 0;
  if (!r.U64(&md_map) || !r.Byte(&mem_type)) {
    return absl::InvalidArgumentError("malformed UCX remote key: cut short");
  }
  if (md_map == 0) return absl::InvalidArgumentError("malformed UCX remote key: no memory domain");
  if (mem_type >= kMemoryTypes) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed UCX remote key: memory type ", mem_type));
  }
  for (uint64_t m = md_map; m != 0; m &= m - 1) {
    uint8_t size = 0;
    if (!r.Byte(&size) || !r.Skip(size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed UCX remote key: a memory domain's key cut short at byte ", r.pos()));
    }
  }
  // What follows (the system device and its distances) is read by UCX with bounds.
  return absl::OkStatus();
}

absl::Status CheckUcxDetails(const peer::v1::UcxDetails& d, const UcxAddressShape* shape) {
  if (d.pools_size() > kMaxUcxPools || d.lanes_size() > kMaxUcxLanes) {
    return absl::InvalidArgumentError(absl::StrCat(d.pools_size(), " pools and ", d.lanes_size(),
                                                   " UCX lanes; at most ", kMaxUcxPools, " and ",
                                                   kMaxUcxLanes));
  }
  for (const peer::v1::UcxLane& lane : d.lanes()) {
    if (lane.rkeys_size() != d.pools_size()) {
      return absl::InvalidArgumentError(absl::StrCat("a UCX lane with ", lane.rkeys_size(),
                                                     " pool keys for ", d.pools_size(), " pools"));
    }
  }
  if (shape == nullptr) return absl::OkStatus();
  auto address = [&](const std::string& a, const std::string& what) -> absl::Status {
    if (a.empty()) return absl::OkStatus();
    absl::Status st = CheckUcxWorkerAddress(a, shape);
    return st.ok() ? st : absl::InvalidArgumentError(absl::StrCat(what, ": ", st.message()));
  };
  auto rkey = [](const std::string& k, const std::string& what) -> absl::Status {
    if (k.empty()) return absl::OkStatus();
    absl::Status st = CheckUcxRkey(k);
    return st.ok() ? st : absl::InvalidArgumentError(absl::StrCat(what, ": ", st.message()));
  };
  GPUMOVE_RETURN_IF_ERROR(address(d.worker_address(), "UCX worker address"));
  for (int i = 0; i < d.pools_size(); ++i) {
    GPUMOVE_RETURN_IF_ERROR(rkey(d.pools(i).rkey(), absl::StrCat("pool ", i, " key")));
  }
  for (int l = 0; l < d.lanes_size(); ++l) {
    const peer::v1::UcxLane& lane = d.lanes(l);
    GPUMOVE_RETURN_IF_ERROR(address(lane.worker_address(), absl::StrCat("UCX lane ", l + 1)));
    for (int i = 0; i < lane.rkeys_size(); ++i) {
      GPUMOVE_RETURN_IF_ERROR(
          rkey(lane.rkeys(i), absl::StrCat("lane ", l + 1, " pool ", i, " key")));
    }
  }
  return absl::OkStatus();
}

}  // namespace gpumove
