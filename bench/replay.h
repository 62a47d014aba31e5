// `kvroute-bench replay`: the arrivals of a workload (Mooncake trace or built-in generator, the same ones
// `kvroute-bench simulate` uses) sent over HTTP to any OpenAI-compatible endpoint (kvroute, or the balancer a
// user runs today), time-scaled, with latencies measured at the client. The report has the shape of
// simulate's (bench/report.h), so the two can be read side by side and compared number for number.
//
// Contract:
//  * Time: request i is sent at arrival_s / rate_scale / speed wall seconds after the start; measured
//    latencies are multiplied by `speed`, so with `kvroute-sim --speed X` and `--speed X` here every number
//    is in model seconds, as the simulation reports them.
//  * Prompts: `/v1/completions` with `prompt` as token ids, materialized from the block chain (16 ids per
//    block derived from the block's hash; see prompt_token_ids), so equal chain prefixes give equal token
//    prefixes and the endpoint's prefix cache sees the workload's sharing. `max_tokens` = output_tokens,
//    `ignore_eos`, streamed with `stream_options.include_usage`; session workloads send `x-session-id`.
//  * Measured per request: TTFT (send -> first SSE event carrying text), inter-token latency, end-to-end,
//    usage (prompt, completion, cached tokens), the serving worker from `x-kvroute-worker`.
//  * Errors (connect, timeout, HTTP status, malformed stream) are recorded per request and counted; replay()
//    never throws on the data path. At most `concurrency_limit` requests are in flight; later arrivals wait
//    (and are counted as delayed) — latencies are measured from the moment a request is actually sent.
//
//   auto opts = parse_replay_args({"--target", "http://127.0.0.1:8080", "--workload", "multi_turn",
//                                  "--speed", "20", "--max-requests", "200"});
//   Result<Workload> w = load_replay_workload(*opts);
//   Result<ReplayRun> run = replay(*w, *opts);
//   std::cout << format_table(replay_report(*w, *opts, *run));
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench/report.h"
#include "bench/workload.h"
#include "util/result.h"

namespace kvroute::bench {

struct ReplayOptions {
  std::string target;            // http://HOST:PORT
  std::string host;              // parsed from target
  std::string port;
  std::string path = "/v1/completions";
  std::string trace;             // --trace FILE (Mooncake format)
  std::string workload;          // --workload NAME
  std::string model = "qwen3-8b";  // the requests' "model" (and the generators' namespace)
  std::string gpu = "h100-80gb";   // profile assumed for the capacity-bound hit rate only
  std::uint64_t seed = 1;
  double speed = 1.0;            // the endpoint runs this many times faster than real time
  double rate_scale = 1.0;       // arrival times divided by this (2 = twice the request rate)
  double request_rate = 0;       // > 0: requests per model second; sets rate_scale from the arrivals
  std::size_t max_requests = 0;  // 0 = all
  std::size_t concurrency_limit = 512;
  double timeout_s = 300;        // wall seconds allowed per request, streaming included
  std::string json_path;
  std::string label = "replay";
  bool verbose = false;
  bool progress = true;
};

std::string replay_usage();
// Parses the arguments after "replay". "--help" yields an Error whose message is the usage text.
Result<ReplayOptions> parse_replay_args(const std::vector<std::string>& args);
Result<Workload> load_replay_workload(const ReplayOptions& options);

// What the client observed for one request. Times are model seconds (wall x speed).
struct ReplayRecord {
  std::uint64_t id = 0;
  std::uint64_t session = 0;
  std::string who;                // for display: "session N", else the source's grouping key, else empty
  bool ok = false;
  std::string error;              // empty when ok
  int status = 0;                 // HTTP status (0: no response)
  std::string worker;             // x-kvroute-worker, empty when the endpoint does not send it
  std::uint32_t prompt_tokens = 0;     // usage.prompt_tokens (the request's when usage is missing)
  std::uint32_t completion_tokens = 0;
  std::uint32_t cached_tokens = 0;     // usage.prompt_tokens_details.cached_tokens
  bool has_usage = false;
  double send_s = 0;              // when it was sent, from the start of the replay
  double ttft_s = -1;             // -1: no content arrived
  double e2e_s = 0;
  double decode_s = 0;            // first content event -> last content event
  std::uint32_t content_events = 0;
  bool delayed = false;           // waited for a free slot under the concurrency limit
};

struct ReplayRun {
  std::vector<ReplayRecord> records;  // by request id
  double wall_s = 0;
  std::size_t errors = 0;
  std::size_t delayed = 0;
  std::map<std::string, std::size_t> per_worker;  // completed requests per x-kvroute-worker
};

// Token ids of a request's prompt: for block k, ids splitmix64(hash_k + j) % 100000 + 1000, j = 0..15;
// the tail that fills no block comes from the request id (it is never cached on its own).
std::vector<std::uint32_t> prompt_token_ids(const Request& r);
// The JSON body sent for `r`.
std::string replay_request_body(const Request& r, const std::string& model);

// Sends every request and waits for all of them. `on_done` (optional) is called on the replay's thread as
// each request finishes, in completion order. An Error only when the replay cannot start (bad target).
Result<ReplayRun> replay(const Workload& workload, const ReplayOptions& options,
                         const std::function<void(const ReplayRecord&)>& on_done = {});

// The run as one PolicyResult (named options.label): hit rate token-weighted over completed requests as the
// endpoint reported it; load_cov and requests_cov are both the CoV of completed requests per worker (busy
// time is not visible from the client); evicted_blocks and decision_us are not measured (0).
PolicyResult summarize_replay(const ReplayRun& run, const std::string& label);
// A RunReport around summarize_replay(): workers = distinct x-kvroute-worker values; bounds of the workload
// on that many workers of the --model/--gpu profile.
RunReport replay_report(const Workload& workload, const ReplayOptions& options, const ReplayRun& run);

// The whole subcommand; returns the exit code (0 when at least one request completed).
int run_replay_command(const std::vector<std::string>& args);

}  // namespace kvroute::bench
