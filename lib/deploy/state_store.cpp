#include "deploy/state_store.hpp"
#include "deploy/record_file.hpp"
#include "util/json.hpp"

#include "sys/log.hpp"
#include "util/files.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <system_error>
#include <tuple>
#include <utility>

namespace modeld::deploy {

namespace fs = std::filesystem;

namespace {

// Deployment record files, oldest first. An id is STAMP-NAME (STAMP: YYYYMMDDTHHMMSSZ, the start
// second), then -2, -3, ... -10 ... for later ones of that model in that second: within one
// second a later id of a model is longer, or as long and greater, so the order is the stamp, then
// the length, then the name ("-10" after "-9", "NAME" before "NAME-2"; plain name order would put
// "NAME-10" before "NAME-2", and NAME.json after NAME-2.json).
void sort_oldest_first(std::vector<fs::path>& files) {
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    const auto x = a.stem().string(), y = b.stem().string();
    constexpr std::size_t kStamp = 16;
    const auto sx = x.substr(0, kStamp), sy = y.substr(0, kStamp);
    if (sx != sy) return sx < sy;
    if (x.size() != y.size()) return x.size() < y.size();
    return x < y;
  });
}

}  // namespace

const ActiveRecord* InService::find(const std::string& model) const {
  auto it = std::find_if(services.begin(), services.end(), [&](const ActiveRecord& a) { return a.model == model; });
  return it == services.end() ? nullptr : &*it;
}

ActiveRecord* InService::find(const std::string& model) {
  return const_cast<ActiveRecord*>(std::as_const(*this).find(model));
}

void InService::put(ActiveRecord r) {
  erase(r.model);
  services.push_back(std::move(r));
}

bool InService::erase(const std::string& model) {
  return std::erase_if(services, [&](const ActiveRecord& a) { return a.model == model; }) > 0;
}

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

std::string_view to_string(StateSource source) {
  switch (source) {
    case StateSource::fresh: return "fresh";
    case StateSource::current: return "state.json";
    case StateSource::previous: return "state.json.prev";
    case StateSource::rebuilt: return "rebuilt";
  }
  return "fresh";
}

namespace {

// The state that `text` (read from `path`) holds; io_error naming the path and what is wrong.
Result<DaemonState> parse_state(const fs::path& path, const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return make_error(Errc::io_error, path.string() + ": not a valid state file: " + why);
  };
  try {
    auto j = nlohmann::json::parse(text);
    // Every state.json modeld wrote is an object with "services" (or "active", before the list):
    // `null`, `[]` or `{}` would otherwise read as "nothing in service" while a model serves.
    if (!j.is_object()) return bad(fmt::format("a JSON {}, not an object", j.type_name()));
    if (!j.contains("services") && !j.contains("active")) return bad("it has neither \"services\" nor \"active\"");
    DaemonState s;
    // "services" since the list; a file from before it has only "active".
    if (j.contains("services"))
      for (const auto& a : j.at("services").get_ref<const nlohmann::json::array_t&>())
        s.active.services.push_back(active_record_from_json(a));
    else if (!j["active"].is_null())
      s.active.put(active_record_from_json(j["active"]));
    if (j.contains("last_active")) s.last_active = j["last_active"].get<std::map<std::string, std::string>>();
    if (j.contains("pulled")) s.pulled = j["pulled"].get<Pulled>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
}

}  // namespace

Result<DaemonState> StateStore::read_state_file(const fs::path& path) {
  auto text = util::read_file(path);
  if (!text) return text.error();
  return parse_state(path, *text);
}

Result<DaemonState> StateStore::load() const {
  auto st = read_state_file(dir_ / "state.json");
  if (!st && st.error().code == Errc::not_found) return DaemonState{};
  return st;
}

LoadedState StateStore::load_or_fall_back() {
  LoadedState out;
  const auto current = dir_ / "state.json", previous = dir_ / "state.json.prev";
  auto text = util::read_file(current);
  Result<DaemonState> st = text ? parse_state(current, *text) : Result<DaemonState>(text.error());
  if (st) {
    out.state = std::move(*st);
    out.source = StateSource::current;
    return out;
  }
  const bool missing = st.error().code == Errc::not_found;
  if (!missing) {
    out.problems.push_back(st.error().message);
    // Kept for the operator: the next save replaces state.json.
    std::error_code ec;
    fs::copy_file(current, dir_ / "state.json.bad", fs::copy_options::overwrite_existing, ec);
  }
  auto prev_text = util::read_file(previous);
  if (!prev_text && prev_text.error().code == Errc::not_found) {
    out.source = missing ? StateSource::fresh : StateSource::rebuilt;
    return out;
  }
  auto prev = prev_text ? parse_state(previous, *prev_text) : Result<DaemonState>(prev_text.error());
  if (!prev) {
    out.problems.push_back(prev.error().message);
    out.source = StateSource::rebuilt;
    return out;
  }
  if (missing) out.problems.push_back(current.string() + ": missing while state.json.prev exists");
  out.state = std::move(*prev);
  out.source = StateSource::previous;
  return out;
}

Result<void> StateStore::save(const DaemonState& s) {
  nlohmann::json j;
  j["services"] = nlohmann::json::array();
  for (const auto& a : s.active.services) j["services"].push_back(to_json(a));
  // The service put into service last also as "active", the form a modeld from before the list reads.
  const auto* last = s.active.last();
  j["active"] = last ? to_json(*last) : nlohmann::json(nullptr);
  j["last_active"] = s.last_active;
  j["pulled"] = s.pulled;
  const auto text = util::dump_json(j, 2) + "\n";
  if (auto r = util::write_file_atomically(dir_ / "state.json", text, 0600); !r) return r;
  // The copy second: a crash between the two writes leaves a good state.json and an older copy.
  return util::write_file_atomically(dir_ / "state.json.prev", text, 0600);
}

Result<void> StateStore::save_deployment(const Deployment& d, std::size_t keep) {
  auto r = util::write_file_atomically(dir_ / "deployments" / (d.id + ".json"),
                                       util::dump_json(record_file_json(d), 2) + "\n", 0600);
  if (!r) return r;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / "deployments", ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  if (files.size() > keep) {
    sort_oldest_first(files);
    for (std::size_t i = 0; i + keep < files.size(); ++i) fs::remove(files[i], ec);
  }
  return {};
}

Result<Deployment> read_deployment_file(const fs::path& path) {
  auto text = util::read_file(path);
  if (!text) return text.error();
  try {
    auto d = record_from_file_json(nlohmann::json::parse(*text));
    if (!d) return make_error(d.error().code, path.string() + ": " + d.error().message);
    return d;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::io_error, fmt::format("{}: not JSON ({})", path.string(), e.what()));
  }
}

std::vector<Deployment> StateStore::load_history(std::size_t limit) const {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / "deployments", ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  // Every record kept (at most `keep` of save_deployment), ordered by start below.
  std::vector<Deployment> out;
  for (const auto& f : files) {
    auto d = read_deployment_file(f);
    if (d)
      out.push_back(std::move(*d));
    else
      sys::logf(sys::Level::warning, "{}, ignoring", d.error().message);
  }
  // Newest first: by start second, then by start time in ns (records written without it count
  // as the oldest of their second), then as sort_oldest_first orders ids.
  auto key = [](const Deployment& d) {
    constexpr std::size_t kStamp = 16;
    return std::make_tuple(d.id.substr(0, kStamp), d.started_ns, d.id.size(), d.id);
  };
  std::sort(out.begin(), out.end(), [&](const Deployment& a, const Deployment& b) { return key(a) > key(b); });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace modeld::deploy
