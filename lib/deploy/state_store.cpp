#include "deploy/state_store.hpp"
#include "util/json.hpp"

#include "sys/log.hpp"
#include "util/files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <system_error>

namespace modeld::deploy {

namespace fs = std::filesystem;

StateStore::StateStore(fs::path state_dir) : dir_(std::move(state_dir)) {}

Result<void> StateStore::init() {
  for (const auto& d : {dir_, dir_ / "deployments"}) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) return make_error(Errc::io_error, d.string() + ": cannot create: " + ec.message());
    fs::permissions(d, fs::perms::owner_all, fs::perm_options::replace, ec);
  }
  return {};
}

Result<DaemonState> StateStore::load() const {
  auto path = dir_ / "state.json";
  auto text = util::read_file(path);
  if (!text) {
    if (text.error().code == Errc::not_found) return DaemonState{};
    return text.error();
  }
  try {
    auto j = nlohmann::json::parse(*text);
    DaemonState s;
    if (j.contains("active") && !j["active"].is_null()) {
      const auto& a = j["active"];
      s.active = ActiveRecord{a.at("model").get<std::string>(), a.at("commit").get<std::string>(),
                              a.at("since").get<std::string>()};
    }
    if (j.contains("last_active"))
      s.last_active = j["last_active"].get<std::map<std::string, std::string>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::io_error, path.string() + ": not a valid state file: " + e.what());
  }
}

Result<void> StateStore::save(const DaemonState& s) {
  nlohmann::json j;
  j["active"] = s.active ? nlohmann::json{{"model", s.active->model},
                                          {"commit", s.active->commit},
                                          {"since", s.active->since}}
                         : nlohmann::json(nullptr);
  j["last_active"] = s.last_active;
  return util::write_file_atomically(dir_ / "state.json", util::dump_json(j, 2) + "\n", 0600);
}

Result<void> StateStore::save_deployment(const Deployment& d, std::size_t keep) {
  auto r = util::write_file_atomically(dir_ / "deployments" / (d.id + ".json"),
                                       util::dump_json(to_json(d, true), 2) + "\n", 0600);
  if (!r) return r;
  // Ids sort by start time, so the oldest files come first in name order.
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / "deployments", ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  if (files.size() > keep) {
    std::sort(files.begin(), files.end());
    for (std::size_t i = 0; i + keep < files.size(); ++i) fs::remove(files[i], ec);
  }
  return {};
}

std::vector<Deployment> StateStore::load_history(std::size_t limit) const {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / "deployments", ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end(), std::greater<>());
  std::vector<Deployment> out;
  for (const auto& f : files) {
    if (out.size() >= limit) break;
    auto text = util::read_file(f);
    if (!text) continue;
    try {
      auto d = deployment_from_json(nlohmann::json::parse(*text));
      if (d) {
        out.push_back(std::move(*d));
        continue;
      }
      sys::logf(sys::Level::warning, "{}: {}, ignoring", f.string(), d.error().message);
    } catch (const nlohmann::json::exception& e) {
      sys::logf(sys::Level::warning, "{}: not JSON ({}), ignoring", f.string(), e.what());
    }
  }
  return out;
}

}  // namespace modeld::deploy
