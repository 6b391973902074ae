#pragma once
// The Hub token, by the contract's precedence: [hub] token_file, else the systemd credential
// "hf-token", else $HF_TOKEN. Its value is never logged, nor put in an error; only where it came
// from is.

#include "config/config.hpp"
#include "util/error.hpp"

#include <string>

namespace modeld {

/// A Hub token and where it came from.
struct Token {
  std::string value;
  std::string source;  ///< "token_file /etc/modeld/hf-token", "credential hf-token", "$HF_TOKEN", "none"
};

/// Reads the token `cfg` names, else the credential, else $HF_TOKEN; errors (modeld then refuses
/// to start): config_invalid for a token_file that is missing, unreadable or open to group or
/// others. A credential that cannot be read is reported and skipped; an empty one (the unit's
/// SetCredential= fallback) counts as absent. Reads files; does not block otherwise.
Result<Token> read_token(const config::Config& cfg);

/// Makes the process non-dumpable when `token` holds a secret, so that no core dump (the
/// watchdog's SIGABRT, a crash) copies it; logs whether that worked. Never fails.
void protect_token(const Token& token);

}  // namespace modeld
