// The table of switch strategies and the choice among them; the strategies are their own files
// (restart_switch.cpp).
#include "deploy/switch_strategy.hpp"
#include "deploy/phase.hpp"

#include <fmt/format.h>

#include <array>

namespace modeld::deploy {

namespace {

// The strategies serve.switch may ask for; the first is the one every chain of fallbacks ends with.
std::span<const SwitchStrategy* const> table_of(const Services& services) {
  if (!services.switch_strategies.empty()) return services.switch_strategies;
  return builtin_switches();
}

const SwitchStrategy* find(std::span<const SwitchStrategy* const> table, std::string_view method) {
  for (const auto* s : table)
    if (s->method == method) return s;
  return nullptr;
}

}  // namespace

std::span<const SwitchStrategy* const> builtin_switches() {
  static const std::array<const SwitchStrategy*, 1> table{&restart_switch()};
  return table;
}

const SwitchStrategy& switch_named(const Services& services, std::string_view method) {
  if (const auto* s = find(table_of(services), method)) return *s;
  return restart_switch();
}

SwitchChoice choose_switch(const Services& services, const SwitchQuery& q) {
  const auto table = table_of(services);
  const SwitchStrategy* s = nullptr;
  for (const auto* t : table)
    if (!s && t->setting == q.model.serve.switch_setting) s = t;
  if (!s) s = &restart_switch();  // config::load admits only the settings of built-in strategies
  std::string why_not;
  // A chain of fallbacks no longer than the table: a cycle ends with restart.
  for (std::size_t tries = 0; tries < table.size(); ++tries) {
    const auto v = s->applies(q);
    if (v.applies) return {s, why_not.empty() ? v.why : fmt::format("{}; {}", why_not, v.why)};
    why_not += fmt::format("{}{} does not apply: {}", why_not.empty() ? "" : "; ", s->method, v.why);
    const auto* next = find(table, s->fallback);
    if (!next) break;
    s = next;
  }
  return {&restart_switch(), why_not};
}

const PhaseRow& row_of(Step s, const SwitchStrategy& strategy) {
  for (const auto& row : strategy.rows())
    if (row.step == s) return row;
  return row_of(s);
}

Step resume_step(const Deployment& d, const SwitchStrategy& strategy) {
  if (const auto& back = row_of(strategy.rollback, strategy); back.resumes_here && back.resumes_here(d))
    return strategy.rollback;
  // A stop's plan, else a deploy's (a pull's steps are the first of them, and a record claimed by
  // a later step continues there whatever its kind).
  const auto steps = plan_steps(d.kind == Kind::stop ? Kind::stop : Kind::deploy, d.downtime_first, strategy);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (const auto& row = row_of(it->step, strategy); row.resumes_here && row.resumes_here(d)) return it->step;
  return Step::planning;
}

}  // namespace modeld::deploy
