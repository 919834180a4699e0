// Parsing of torchrun's rendezvous flags (see rdzv_options.h).
#include "dtorch/launch/rdzv_options.h"

#include <cmath>
#include <cstdlib>

#include "dtorch/core/error.h"

namespace dtorch::launch {
namespace {

int whole(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  DTORCH_CHECK_T(ConfigError, !v.empty() && *end == '\0' && x >= 0 && x <= 1 << 30, flag, "=", v,
                 " is not a whole number");
  return static_cast<int>(x);
}

double seconds(const std::string& key, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  DTORCH_CHECK_T(ConfigError, !v.empty() && *end == '\0' && std::isfinite(x) && x > 0,
                 "--rdzv-conf ", key, "=", v, " must be a number of seconds above 0");
  return x;
}

}  // namespace

RdzvBackend parse_rdzv_backend(const std::string& v) {
  if (v == "c10d") return RdzvBackend::C10d;
  if (v == "static") return RdzvBackend::Static;
  DTORCH_FAIL(ConfigError, "--rdzv-backend=", v, " is not supported; use c10d (node ranks ",
              "assigned on arrival, elastic --nnodes MIN:MAX) or static (each node given ",
              "--node-rank)", v.rfind("etcd", 0) == 0 ? "; dtorch needs no etcd server" : "");
}

Endpoint parse_endpoint(const std::string& v, int default_port) {
  DTORCH_CHECK_T(ConfigError, !v.empty(),
                 "--rdzv-endpoint is empty; give HOST[:PORT] of the node that serves the "
                 "rendezvous (e.g. $head_node_ip:29500)");
  Endpoint e{v, default_port};
  std::string port;
  if (v.front() == '[') {  // [v6]:port
    auto close = v.find(']');
    DTORCH_CHECK_T(ConfigError, close != std::string::npos, "--rdzv-endpoint=", v,
                   " opens '[' without ']'; write an IPv6 address as [ADDR]:PORT");
    e.host = v.substr(1, close - 1);
    if (close + 1 < v.size()) {
      DTORCH_CHECK_T(ConfigError, v[close + 1] == ':', "--rdzv-endpoint=", v,
                     ": expected ':' and a port after ']'");
      port = v.substr(close + 2);
    }
  } else if (auto colon = v.find(':'); colon != std::string::npos) {
    DTORCH_CHECK_T(ConfigError, v.find(':', colon + 1) == std::string::npos, "--rdzv-endpoint=", v,
                   " has several ':'; write an IPv6 address as [ADDR]:PORT");
    e.host = v.substr(0, colon);
    port = v.substr(colon + 1);
  }
  DTORCH_CHECK_T(ConfigError, !e.host.empty(), "--rdzv-endpoint=", v,
                 " names no host; give HOST[:PORT]");
  if (!port.empty() || v.back() == ':') {
    e.port = whole("--rdzv-endpoint port", port);
    DTORCH_CHECK_T(ConfigError, e.port >= 1 && e.port <= 65535, "--rdzv-endpoint=", v, ": port ",
                   e.port, " is not in 1..65535");
  }
  return e;
}

RdzvConf parse_rdzv_conf(const std::string& v) {
  RdzvConf c;
  std::size_t at = 0;
  while (at < v.size()) {
    std::size_t comma = v.find(',', at);
    std::string item = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? v.size() : comma + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    DTORCH_CHECK_T(ConfigError, eq != std::string::npos, "--rdzv-conf: '", item,
                   "' is not key=value");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "join_timeout") {
      c.join_timeout = seconds(key, value);
      c.join_timeout_given = true;
    } else if (key == "last_call_timeout") {
      c.last_call_timeout = seconds(key, value);
    } else if (key == "close_timeout") {
      c.close_timeout = seconds(key, value);
    } else if (key == "keep_alive_interval") {
      c.keep_alive_interval = seconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      c.keep_alive_max_attempt = whole("--rdzv-conf keep_alive_max_attempt", value);
      DTORCH_CHECK_T(ConfigError, c.keep_alive_max_attempt >= 1,
                     "--rdzv-conf keep_alive_max_attempt must be at least 1");
    } else if (key == "timeout" || key == "read_timeout" || key == "is_host" ||
               key == "store_type" || key == "use_libuv") {
      // torchrun's store-connection knobs: dtorch's store needs none of them.
    } else {
      DTORCH_FAIL(ConfigError, "--rdzv-conf: unknown key '", key,
                  "'; dtorch knows join_timeout, last_call_timeout, close_timeout, "
                  "keep_alive_interval, keep_alive_max_attempt (seconds, except the last)");
    }
  }
  return c;
}

NodeRange parse_node_range(const std::string& v) {
  auto colon = v.find(':');
  NodeRange r;
  if (colon == std::string::npos) {
    r.min = r.max = whole("--nnodes", v);
  } else {
    r.min = whole("--nnodes", v.substr(0, colon));
    r.max = whole("--nnodes", v.substr(colon + 1));
  }
  DTORCH_CHECK_T(ConfigError, r.min >= 1, "--nnodes=", v, " must be at least 1");
  DTORCH_CHECK_T(ConfigError, r.min <= r.max, "--nnodes=", v, ": MIN ", r.min, " is more than MAX ",
                 r.max);
  return r;
}

}  // namespace dtorch::launch
