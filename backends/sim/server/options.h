// SimServerOptions: kvroute-sim's command line (every flag is documented in kUsage, printed by --help).
//
// Contract: parse_sim_options() never exits or throws; a bad flag is an Error whose message names the flag
// and what it expected (main prints it and exits with status 2).
//
//   auto opts = parse_sim_options({"--port", "8100", "--workers", "4", "--speed", "50"});
//   if (!opts) { std::cerr << opts.error().message; return 2; }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sim/engine.h"
#include "backends/sim/server/kv_events.h"
#include "util/result.h"

namespace kvroute::sim {

// Which publisher a worker runs with --kv-events-port: vLLM's msgpack (--kv-events-encoding picks the shape)
// or kvroute's native protobuf stream (docs/events.md section 4).
enum class KvEventsFormat { kVllm, kNative };

struct SimServerOptions {
  bool help = false;
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  int workers = 1;
  std::string model = "qwen3-8b";      // built-in model profile
  std::string served_model_name;       // id in /v1/models; defaults to --model (or the config file's name)
  std::string api_key;                 // non-empty: /v1 routes need "Authorization: Bearer KEY", as vLLM's
  std::vector<std::pair<std::string, std::string>> lora_modules;  // --lora-modules NAME=PATH
  std::string model_config;            // path of a Hugging Face config.json; overrides --model's shape
  std::string gpu = "h100-80gb";
  double cpu_tier_gb = 0;
  PrefixCommit prefix_commit = PrefixCommit::kStepEnd;  // when computed blocks become hits (engine.h)
  double speed = 1.0;                  // engine seconds per wall second
  std::optional<std::uint64_t> num_gpu_blocks;
  std::optional<int> max_num_seqs;
  std::optional<std::uint32_t> max_model_len;
  std::uint16_t kv_events_port = 0;    // 0 = no KV events; worker i publishes on port + i
  std::uint16_t kv_events_replay_port = 0;  // 0 = kv_events_port + workers (right after the PUB range)
  KvEventsFormat kv_events_format = KvEventsFormat::kVllm;
  KvEventEncoding kv_events_encoding = KvEventEncoding::kPositional;  // kNative when the format is native
  std::string kv_events_topic;         // native: defaults to "kvroute.v1" and must start with it
  double kv_events_load_interval_s = 1.0;  // native: wall seconds between LoadReports of an idle worker
  double kv_events_delay_s = 0;           // every KV-event batch is published this many wall seconds late
  std::uint64_t seed = 0;
  std::size_t max_body_bytes = 8u << 20;
  double idle_timeout_s = 60;          // keep-alive connection idle limit (wall seconds)
  // Fault injection (--fault): inference requests answered with this status (0: served), or never answered.
  unsigned fail_status = 0;
  bool hang = false;
};

extern const char* const kUsage;

Result<SimServerOptions> parse_sim_options(const std::vector<std::string_view>& args);

}  // namespace kvroute::sim
