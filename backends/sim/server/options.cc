#include "backends/sim/server/options.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <cmath>

#include "backends/events/native_events.h"
#include "util/split.h"

namespace kvroute::sim {

const char* const kUsage = R"(kvroute-sim: a simulated vLLM worker (OpenAI API, prefix cache, metrics, KV events).

usage: kvroute-sim [flags]
       kvroute-sim kv-size CONFIG.json|MODEL [--gpu NAME]   print KV sizing and exit
       kvroute-sim plan CONFIG.json|MODEL [flags]           capacity plan (plan --help) and exit

flags (--flag VALUE or --flag=VALUE):
  --host ADDR                 address to listen on (default 127.0.0.1)
  --port P                    first HTTP port (default 8000); worker i listens on P+i
  --workers N                 independent simulated workers in this process (default 1)
  --model NAME                built-in model profile (default qwen3-8b; also llama-3.1-8b, llama-3.1-70b, llama-3.1-405b, deepseek-v3)
  --served-model-name NAME    model id reported by /v1/models and in responses (default: the model name)
  --api-key KEY               as vllm serve --api-key: /v1 routes answer 401 without "Authorization: Bearer KEY"
  --lora-modules NAME=PATH[,NAME=PATH...]
                              LoRA adapters loaded at start, as vllm serve --lora-modules; requests name one as
                              their model; more come and go with POST /v1/load_lora_adapter and
                              /v1/unload_lora_adapter
  --model-config FILE         Hugging Face config.json describing the model (overrides --model's shape)
  --gpu NAME                  built-in GPU profile (default h100-80gb; also h200-141gb, a100-80gb, l4)
  --cpu-tier-gb X             size of the CPU KV tier in GB (default 0 = none)
  --prefix-commit WHEN        when a step's computed blocks become prefix-cache hits: step-end (after the
                              step, as SGLang) or schedule (when it is scheduled, as vLLM v1) (default step-end)
  --speed N                   run N times faster than real time: every simulated duration is divided by N
                              (default 1)
  --num-gpu-blocks N          override the GPU KV pool size in 16-token blocks (small pools for tests)
  --max-num-seqs N            cap on running sequences (default: the engine's)
  --max-model-len N           longest prompt + output accepted (default: the engine's)
  --kv-events-port BASE       publish KV events on ZMQ PUB tcp://HOST:BASE+i (default 0 = off)
  --kv-events-replay-port R   replay ROUTER of worker i at R+i (default BASE + workers)
  --kv-events-format F        vllm (vLLM's msgpack publisher) or native (kvroute.v1 protobuf EventBatch,
                              docs/events.md; adds LoadReport events) (default vllm)
  --kv-events-encoding E      vllm format: positional (vLLM <= 0.23 arrays) or map (current vLLM)
                              (default positional)
  --kv-events-topic T         topic frame of every KV-event message (default empty, as vLLM; native:
                              default kvroute.v1, and T must start with kvroute.v1)
  --kv-events-load-interval S native: a LoadReport at least every S wall seconds, in a batch of its own
                              when no event batch carried one (default 1)
  --kv-events-delay S         publish every KV-event batch S wall seconds late, in order (default 0), as a
                              busy publisher or a slow network would
  --seed N                    seed of generated text and block hashes (default 0)
  --max-body-bytes N          largest accepted request body (default 8388608)
  --idle-timeout S            close a keep-alive connection idle for S wall seconds (default 60)
  --fault F                   fault injection for failover tests: a status code (e.g. 503) answers every
                              inference request (/v1/completions, /v1/chat/completions, /v1/responses) with
                              it; hang reads them and never answers; /health and the rest stay served
  --help                      print this text

Generation never stops early: every request produces exactly max_tokens tokens (default 16, capped by
max-model-len), so ignore_eos is accepted and changes nothing.
)";

namespace {

template <class T>
Result<T> parse_number(std::string_view flag, std::string_view v, T min, T max) {
  T out{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out < min || out > max) {
    return make_error(std::string(flag) + ": expected a number in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "], got '" + std::string(v) + "'");
  }
  return out;
}

Result<double> parse_double(std::string_view flag, std::string_view v, double min) {
  // std::from_chars for double is in GCC 12's libstdc++.
  double out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(out) || out < min) {
    return make_error(std::string(flag) + ": expected a number >= " + std::to_string(min) + ", got '" +
                      std::string(v) + "'");
  }
  return out;
}

}  // namespace

Result<SimServerOptions> parse_sim_options(const std::vector<std::string_view>& args) {
  SimServerOptions o;
  bool replay_set = false;
  bool encoding_set = false;
  bool topic_set = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    std::string_view value;
    bool has_value = false;
    if (auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (!flag.starts_with("--")) return make_error("unexpected argument '" + std::string(flag) + "' (see --help)");
    static constexpr std::string_view kKnown[] = {
        "--host", "--port", "--workers", "--model", "--served-model-name", "--api-key", "--lora-modules",
        "--model-config", "--gpu",
        "--cpu-tier-gb", "--prefix-commit", "--speed", "--num-gpu-blocks", "--max-num-seqs", "--max-model-len",
        "--kv-events-port", "--kv-events-replay-port", "--kv-events-format", "--kv-events-encoding",
        "--kv-events-topic", "--kv-events-load-interval", "--kv-events-delay", "--seed", "--max-body-bytes",
        "--idle-timeout", "--fault"};
    if (std::find(std::begin(kKnown), std::end(kKnown), flag) == std::end(kKnown)) {
      return make_error("unknown flag '" + std::string(flag) + "' (see --help)");
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return make_error(std::string(flag) + ": missing value");
      value = args[++i];
    }
    auto set_u16 = [&](std::uint16_t& dst, std::uint16_t min) -> std::optional<Error> {
      auto r = parse_number<std::uint16_t>(flag, value, min, 65535);
      if (!r) return r.error();
      dst = *r;
      return std::nullopt;
    };
    std::optional<Error> err;
    if (flag == "--host") {
      o.host = std::string(value);
    } else if (flag == "--port") {
      err = set_u16(o.port, 1);
    } else if (flag == "--workers") {
      auto r = parse_number<int>(flag, value, 1, 1024);
      if (!r) return r.error();
      o.workers = *r;
    } else if (flag == "--model") {
      o.model = std::string(value);
    } else if (flag == "--served-model-name") {
      o.served_model_name = std::string(value);
    } else if (flag == "--lora-modules") {
      for (const std::string_view item : split(value, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
          return make_error("--lora-modules: '" + std::string(item) + "' is not NAME=PATH");
        }
        o.lora_modules.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
      }
    } else if (flag == "--api-key") {
      if (value.empty()) return make_error("--api-key: must not be empty");
      o.api_key = std::string(value);
    } else if (flag == "--model-config") {
      o.model_config = std::string(value);
    } else if (flag == "--gpu") {
      o.gpu = std::string(value);
    } else if (flag == "--cpu-tier-gb") {
      auto r = parse_double(flag, value, 0);
      if (!r) return r.error();
      o.cpu_tier_gb = *r;
    } else if (flag == "--prefix-commit") {
      auto r = parse_prefix_commit(value);
      if (!r) return make_error("--prefix-commit: " + r.error().message);
      o.prefix_commit = *r;
    } else if (flag == "--speed") {
      auto r = parse_double(flag, value, 1e-6);
      if (!r) return r.error();
      o.speed = *r;
    } else if (flag == "--num-gpu-blocks") {
      auto r = parse_number<std::uint64_t>(flag, value, 1, std::uint64_t{1} << 40);
      if (!r) return r.error();
      o.num_gpu_blocks = *r;
    } else if (flag == "--max-num-seqs") {
      auto r = parse_number<int>(flag, value, 1, 1 << 20);
      if (!r) return r.error();
      o.max_num_seqs = *r;
    } else if (flag == "--max-model-len") {
      auto r = parse_number<std::uint32_t>(flag, value, 1, 1u << 30);
      if (!r) return r.error();
      o.max_model_len = *r;
    } else if (flag == "--kv-events-port") {
      err = set_u16(o.kv_events_port, 0);
    } else if (flag == "--kv-events-replay-port") {
      err = set_u16(o.kv_events_replay_port, 1);
      replay_set = true;
    } else if (flag == "--kv-events-format") {
      if (value == "vllm") o.kv_events_format = KvEventsFormat::kVllm;
      else if (value == "native") o.kv_events_format = KvEventsFormat::kNative;
      else return make_error("--kv-events-format: expected 'vllm' or 'native', got '" + std::string(value) + "'");
    } else if (flag == "--kv-events-encoding") {
      if (value == "positional") o.kv_events_encoding = KvEventEncoding::kPositional;
      else if (value == "map") o.kv_events_encoding = KvEventEncoding::kMap;
      else return make_error("--kv-events-encoding: expected 'positional' or 'map', got '" + std::string(value) + "'");
      encoding_set = true;
    } else if (flag == "--kv-events-topic") {
      o.kv_events_topic = std::string(value);
      topic_set = true;
    } else if (flag == "--kv-events-load-interval") {
      auto r = parse_double(flag, value, 0.001);
      if (!r) return r.error();
      o.kv_events_load_interval_s = *r;
    } else if (flag == "--kv-events-delay") {
      auto r = parse_double(flag, value, 0.0);
      if (!r) return r.error();
      o.kv_events_delay_s = *r;
    } else if (flag == "--seed") {
      auto r = parse_number<std::uint64_t>(flag, value, 0, UINT64_MAX);
      if (!r) return r.error();
      o.seed = *r;
    } else if (flag == "--max-body-bytes") {
      auto r = parse_number<std::size_t>(flag, value, 1024, std::size_t{1} << 32);
      if (!r) return r.error();
      o.max_body_bytes = *r;
    } else if (flag == "--idle-timeout") {
      auto r = parse_double(flag, value, 0.001);
      if (!r) return r.error();
      o.idle_timeout_s = *r;
    } else if (flag == "--fault") {
      if (value == "hang") {
        o.hang = true;
      } else {
        auto r = parse_number<unsigned>(flag, value, 400, 599);
        if (!r) return make_error("--fault: expected hang or an HTTP status from 400 to 599, got '" + std::string(value) + "'");
        o.fail_status = *r;
      }
    } else {
      return make_error("unknown flag '" + std::string(flag) + "' (see --help)");
    }
    if (err) return *err;
  }
  // The router tells the payload encoding by the topic (docs/events.md), so topics are not free.
  const std::string_view native_prefix = events::kNativeTopicPrefix;
  if (o.kv_events_format == KvEventsFormat::kNative) {
    if (encoding_set) return make_error("--kv-events-encoding applies to --kv-events-format vllm only");
    if (!topic_set) o.kv_events_topic = std::string(native_prefix);
    if (!o.kv_events_topic.starts_with(native_prefix)) {
      return make_error("--kv-events-topic: a native stream's topic must start with '" + std::string(native_prefix) +
                        "' (that prefix selects the router's protobuf decoder), got '" + o.kv_events_topic + "'");
    }
    o.kv_events_encoding = KvEventEncoding::kNative;
  } else if (o.kv_events_topic.starts_with(native_prefix)) {
    return make_error("--kv-events-topic: '" + o.kv_events_topic + "' starts with '" + std::string(native_prefix) +
                      "', which routers read as the native stream; use --kv-events-format native or another topic");
  }
  if (o.port + o.workers - 1 > 65535) return make_error("--port + --workers exceeds 65535");
  if (o.kv_events_port != 0) {
    if (o.kv_events_port + o.workers - 1 > 65535) return make_error("--kv-events-port + --workers exceeds 65535");
    if (!replay_set) {
      if (o.kv_events_port + 2 * o.workers - 1 > 65535) return make_error("no room for the replay port range");
      o.kv_events_replay_port = static_cast<std::uint16_t>(o.kv_events_port + o.workers);
    } else if (o.kv_events_replay_port + o.workers - 1 > 65535) {
      return make_error("--kv-events-replay-port + --workers exceeds 65535");
    }
  }
  return o;
}

}  // namespace kvroute::sim
