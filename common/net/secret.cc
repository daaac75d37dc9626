#include "common/net/secret.h"

#include <openssl/rand.h>

namespace pipetrain::net {

absl::StatusOr<std::string> NewSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("OpenSSL's random generator failed");
  }
  constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  for (const unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 15]);
  }
  return secret;
}

}  // namespace pipetrain::net
