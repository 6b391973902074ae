#include "modeld/token.hpp"

#include "sys/log.hpp"
#include "util/files.hpp"
#include "util/text.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <sys/prctl.h>

namespace modeld {

Result<Token> read_token(const config::Config& cfg) {
  if (!cfg.hub.token_file.empty()) {
    // Refused (config::load reports it too, for --check-config and reloads): the token would
    // be anyone's, or anyone could swap it.
    if (auto why = config::shared_secret_file(cfg.hub.token_file, "hub.token_file"))
      return make_error(Errc::config_invalid, *why + " and start modeld again");
    auto t = util::read_secret_file(cfg.hub.token_file);
    if (!t) return make_error(Errc::config_invalid, "hub.token_file: " + t.error().message);
    if (t->empty())
      sys::logf(sys::Level::warning, "hub.token_file {} is empty: requests to the Hub carry no token",
                cfg.hub.token_file.string());
    return Token{*t, "token_file " + cfg.hub.token_file.string()};
  }
  if (const char* dir = std::getenv("CREDENTIALS_DIRECTORY"); dir && *dir) {
    const auto path = std::filesystem::path(dir) / "hf-token";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      auto t = util::read_secret_file(path);
      if (!t)
        sys::logf(sys::Level::warning, "credential hf-token: {}; trying $HF_TOKEN", t.error().message);
      else if (!t->empty()) {
        // systemd copies the credential privately, but its source may be readable by anyone: the
        // shipped unit's source is the file below (packaging's tmpfiles.d line makes it 0600 at
        // boot; a file written since then may not be).
        if (auto why = config::shared_secret_file("/etc/modeld/hf-token", "the credential file"))
          sys::logf(sys::Level::warning, "{} (when it is the source of LoadCredential=hf-token)", *why);
        return Token{*t, "credential hf-token"};
      }
    }
  }
  if (const char* env = std::getenv("HF_TOKEN"); env && *env) {
    std::string t = env;
    t = std::string(util::trim(t));
    return Token{t, "$HF_TOKEN"};
  }
  return Token{"", "none"};
}

void protect_token(const Token& token) {
  // A core dump would copy the token's bytes into the core file; a non-dumpable process leaves
  // none, and /proc/PID/mem stays closed to ptrace by anyone but a privileged tracer. Only when
  // there is a token: without one, cores are useful.
  if (token.value.empty()) return;
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    sys::log(sys::Level::info, {}, "core dumps are off: this process holds the Hub token");
  else
    sys::logf(sys::Level::warning, "cannot turn core dumps off ({}): a core dump would contain the Hub token",
              std::strerror(errno));
}

}  // namespace modeld
