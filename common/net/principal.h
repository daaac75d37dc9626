// Principals: who a client call acts as. A job belongs to the principal that created it; only
// that principal and `admin` see, train, checkpoint, finish or cancel it (docs/security.md). No
// transport here: the coordinator's core uses these names; TokenAuthProcessor (token_auth.h)
// records a call's principal.
#ifndef PIPETRAIN_COMMON_NET_PRINCIPAL_H_
#define PIPETRAIN_COMMON_NET_PRINCIPAL_H_

#include <string>

namespace pipetrain::net {

// The principal that sees every job (and that a bare token of a token file authenticates as).
inline constexpr char kAdminPrincipal[] = "admin";

// The AuthContext property under which TokenAuthProcessor records a call's principal.
inline constexpr char kPrincipalProperty[] = "pipetrain.principal";

// True if a call acting as `caller` may see a job of `owner`: the owner itself, admin, or any
// caller of a deployment without authentication (caller "", e.g. plaintext on loopback).
inline bool MaySee(const std::string& caller, const std::string& owner) {
  return caller.empty() || caller == kAdminPrincipal || caller == owner;
}

}  // namespace pipetrain::net

#endif  // PIPETRAIN_COMMON_NET_PRINCIPAL_H_
