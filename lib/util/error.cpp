#include "util/error.hpp"

#include "util/name_table.hpp"

namespace modeld {
namespace {
constexpr util::NameTable<Errc, 29> kNames{{
    {Errc::bad_request, "bad_request"},
    {Errc::config_invalid, "config_invalid"},
    {Errc::unknown_model, "unknown_model"},
    {Errc::deployment_running, "deployment_running"},
    {Errc::model_active, "model_active"},
    {Errc::deployment_ended, "deployment_ended"},
    {Errc::not_found, "not_found"},
    {Errc::forbidden, "forbidden"},
    {Errc::too_many_requests, "too_many_requests"},
    {Errc::hub_unauthorized, "hub_unauthorized"},
    {Errc::hub_not_found, "hub_not_found"},
    {Errc::hub_bad_response, "hub_bad_response"},
    {Errc::hub_unavailable, "hub_unavailable"},
    {Errc::network_error, "network_error"},
    {Errc::timeout, "timeout"},
    {Errc::io_error, "io_error"},
    {Errc::disk_full, "disk_full"},
    {Errc::size_mismatch, "size_mismatch"},
    {Errc::checksum_mismatch, "checksum_mismatch"},
    {Errc::safetensors_invalid, "safetensors_invalid"},
    {Errc::checkpoint_incomplete, "checkpoint_incomplete"},
    {Errc::plan_invalid, "plan_invalid"},
    {Errc::unit_failed, "unit_failed"},
    {Errc::stop_timeout, "stop_timeout"},
    {Errc::readiness_timeout, "readiness_timeout"},
    {Errc::health_failed, "health_failed"},
    {Errc::cancelled, "cancelled"},
    {Errc::rollback_failed, "rollback_failed"},
    {Errc::internal, "internal"},
}};
}  // namespace

std::string_view to_string(Errc c) noexcept { return util::name_in(kNames, c).value_or("internal"); }

Errc errc_from_string(std::string_view name) noexcept { return util::value_in(kNames, name).value_or(Errc::internal); }

void throw_exception_from_error(const Error& e, const boost::source_location&) {
  throw ErrorException(e);
}

}  // namespace modeld
