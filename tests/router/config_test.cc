#include "router/config.h"
#include "tests/router/load_args.h"

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

TEST(Config, DefaultsMatchTheDocumentation) {
  auto c = load_args({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->listen, "0.0.0.0:8080");
  EXPECT_EQ(c->admin_listen, "127.0.0.1:9090");
  EXPECT_EQ(c->policy, "kv_cost");
  EXPECT_EQ(c->session_header, "x-session-id");
  EXPECT_DOUBLE_EQ(c->session_margin_s, 0.25);
  EXPECT_EQ(c->worker_max_seqs, 256u);
  EXPECT_EQ(c->max_sessions, 250000u);
  EXPECT_EQ(c->max_held_body_bytes, 512ull << 20);
  EXPECT_EQ(c->response_ids, 100000u);
  EXPECT_EQ(c->priority_header, "x-kvroute-priority");
  EXPECT_EQ(c->shed_queue_depth, 5u);
  EXPECT_DOUBLE_EQ(c->shed_kv_usage, 0.8);
  EXPECT_DOUBLE_EQ(c->prefix_hold_s, 0.4);
  EXPECT_TRUE(c->workers.empty());
}

TEST(Config, PrefixHold) {
  auto c = load_args({"--prefix-hold", "0"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_DOUBLE_EQ(c->prefix_hold_s, 0);  // never holds
  c = load_args({"--prefix-hold=1.5"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_DOUBLE_EQ(c->prefix_hold_s, 1.5);
  EXPECT_FALSE(load_args({"--prefix-hold", "-1"}));
  EXPECT_FALSE(load_args({"--prefix-hold", "soon"}));
}

TEST(Config, SheddingThresholds) {
  auto c = load_args({"--shed-queue-depth", "2", "--shed-kv-usage=0.95", "--priority-header", "x-priority"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->shed_queue_depth, 2u);
  EXPECT_DOUBLE_EQ(c->shed_kv_usage, 0.95);
  EXPECT_EQ(c->priority_header, "x-priority");
  EXPECT_FALSE(load_args({"--shed-kv-usage", "1.5"}));
  EXPECT_FALSE(load_args({"--shed-queue-depth", "0"}));
  EXPECT_FALSE(load_args({"--priority-header="}));
}

TEST(Config, FlagsInBothForms) {
  auto c = load_args({"--listen", "127.0.0.1:1234", "--policy=round_robin", "--worker", "http://127.0.0.1:8001",
                  "--worker=http://localhost:8002/", "--session-ttl", "30", "--worker-max-seqs=1024"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->listen, "127.0.0.1:1234");
  EXPECT_EQ(c->policy, "round_robin");
  ASSERT_EQ(c->workers.size(), 2u);
  EXPECT_EQ(c->workers[1].url, "http://localhost:8002");
  EXPECT_DOUBLE_EQ(c->session_ttl_s, 30);
  EXPECT_EQ(c->worker_max_seqs, 1024u);
}

TEST(Config, YamlFileThenFlagsOverride) {
  const std::string path = testing::TempDir() + "/kvroute-config-test.yaml";
  std::ofstream(path) << "policy: cache_aware\nlisten: 127.0.0.1:7000\nworkers:\n  - http://127.0.0.1:9001\n"
                         "  - url: http://127.0.0.1:9002\n    kv_events: tcp://127.0.0.1:5557\nhealth_interval: 0.5\n"
                         "worker_max_seqs: 512\nmax_sessions: 1000\n";
  auto c = load_args({"--config", path, "--listen", "127.0.0.1:7001"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->policy, "cache_aware");
  EXPECT_EQ(c->listen, "127.0.0.1:7001");
  ASSERT_EQ(c->workers.size(), 2u);
  EXPECT_EQ(c->workers[1].kv_events, "tcp://127.0.0.1:5557");
  EXPECT_DOUBLE_EQ(c->health_interval_s, 0.5);
  EXPECT_EQ(c->worker_max_seqs, 512u);
  EXPECT_EQ(c->max_sessions, 1000u);
  // --worker flags replace the file's list.
  c = load_args({"--config", path, "--worker", "http://127.0.0.1:9009"});
  ASSERT_TRUE(c);
  ASSERT_EQ(c->workers.size(), 1u);
}

TEST(Config, WorkerAttributesForPreciseMode) {
  auto c = load_args({"--worker", "http://127.0.0.1:8001,kv_events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,model=m,dp=2"});
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->workers.size(), 1u);
  EXPECT_EQ(c->workers[0].kv_events, "tcp://127.0.0.1:5557");
  EXPECT_EQ(c->workers[0].kv_events_replay, "tcp://127.0.0.1:5558");
  EXPECT_EQ(c->workers[0].model, "m");
  EXPECT_EQ(c->workers[0].dp_size, 2u);
  auto bad = load_args({"--worker", "http://127.0.0.1:8001,events=x"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("unknown worker attribute 'events'"), std::string::npos);
}

TEST(Config, DiscoverNamesFromFlagsAndYaml) {
  auto c = load_args({"--discover", "vllm.inference.svc.cluster.local:8000,kv_events_port=5557,replay_port=5558,model=m",
                  "--discover=[fd00::1]:9000", "--discover-interval", "2"});
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->discover.size(), 2u);
  EXPECT_EQ(c->discover[0].host, "vllm.inference.svc.cluster.local");
  EXPECT_EQ(c->discover[0].port, "8000");
  EXPECT_EQ(c->discover[0].kv_events_port, 5557);
  EXPECT_EQ(c->discover[0].replay_port, 5558);
  EXPECT_EQ(c->discover[0].model, "m");
  EXPECT_EQ(c->discover[1].host, "fd00::1");
  EXPECT_DOUBLE_EQ(c->discover_interval_s, 2);
  auto y = apply_yaml({}, "discover:\n  - a.b:80\n  - c.d:81,kv_events_port=5557\n", "f.yaml");
  ASSERT_TRUE(y) << y.error().message;
  ASSERT_EQ(y->discover.size(), 2u);
  EXPECT_EQ(y->discover[1].kv_events_port, 5557);
  EXPECT_NE(load_args({"--discover", "a.b"}).error().message.find("HOST:PORT"), std::string::npos);
  EXPECT_NE(load_args({"--discover", "a.b:80,kv_port=1"}).error().message.find("unknown attribute 'kv_port'"), std::string::npos);
  EXPECT_NE(load_args({"--discover", "a.b:80,kv_events_port=0"}).error().message.find("kv_events_port"), std::string::npos);
  EXPECT_NE(apply_yaml({}, "discover: a.b:80", "f.yaml").error().message.find("must be a list"), std::string::npos);
}

TEST(Config, DiscoverK8sServicesFromFlagsAndYaml) {
  auto c = load_args({"--discover-k8s", "llm/vllm:http,kv_events_port=5557,model=m", "--discover-k8s=sglang",
                  "--k8s-api-url", "http://127.0.0.1:8001", "--k8s-token-file", "/t", "--k8s-ca-file", "/c"});
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->discover_k8s.size(), 2u);
  EXPECT_EQ(c->discover_k8s[0].ns, "llm");
  EXPECT_EQ(c->discover_k8s[0].service, "vllm");
  EXPECT_EQ(c->discover_k8s[0].port_name, "http");
  EXPECT_EQ(c->discover_k8s[0].kv_events_port, 5557);
  EXPECT_EQ(c->discover_k8s[0].model, "m");
  EXPECT_EQ(c->discover_k8s[1].ns, "");  // the pod's own namespace
  EXPECT_EQ(c->discover_k8s[1].service, "sglang");
  EXPECT_EQ(c->discover_k8s[1].port_name, "");
  EXPECT_EQ(c->k8s_api_url, "http://127.0.0.1:8001");
  EXPECT_EQ(c->k8s_token_file, "/t");
  EXPECT_EQ(c->k8s_ca_file, "/c");
  auto y = apply_yaml({}, "discover_k8s:\n  - llm/vllm:http\n", "f.yaml");
  ASSERT_TRUE(y) << y.error().message;
  ASSERT_EQ(y->discover_k8s.size(), 1u);
  EXPECT_EQ(y->discover_k8s[0].port_name, "http");
  EXPECT_NE(load_args({"--discover-k8s", "LLM/Vllm"}).error().message.find("[NAMESPACE/]SERVICE[:PORT_NAME]"), std::string::npos);
  EXPECT_NE(load_args({"--discover-k8s", "llm/vllm,replay=1"}).error().message.find("unknown attribute 'replay'"), std::string::npos);
}

TEST(Config, ErrorsNameTheOptionAndValue) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"--policy", "fastest"}, "unknown policy 'fastest'"},
      {{"--listen", "8080"}, "--listen: '8080' must be HOST:PORT"},
      {{"--worker", "ftp://x:1"}, "only http://"},
      {{"--worker", "http://host:99999"}, "port must be a number"},
      {{"--threads", "-1"}, "--threads"},
      {{"--session-ttl", "soon"}, "'soon' is not a number"},
      {{"--max-sessions", "0"}, "--max-sessions"},
      {{"--max-held-body-bytes", "0"}, "--max-held-body-bytes"},
      {{"--bogus", "1"}, "unknown option --bogus"},
      {{"--listen"}, "needs a value"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--config", "/nonexistent/kvroute.yaml"}, "cannot read"},
  };
  for (const auto& c : cases) {
    auto r = load_args(c.args);
    ASSERT_FALSE(r) << c.args[0];
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
  }
}

TEST(Config, WorkerApiKeyFromTheEnvironmentOrAFlag) {
  ::setenv("KVROUTE_WORKER_API_KEY", "from-env", 1);
  auto c = load_args({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->worker_api_key, "from-env");
  EXPECT_EQ(c->worker_authorization(), "Bearer from-env");
  c = load_args({"--worker-api-key", "from-flag"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->worker_api_key, "from-flag");
  ::unsetenv("KVROUTE_WORKER_API_KEY");
  c = load_args({});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->worker_authorization().empty());  // no key, no header
}

TEST(Config, YamlErrors) {
  EXPECT_NE(apply_yaml({}, "policy: [a, b]", "f.yaml").error().message.find("single value"), std::string::npos);
  EXPECT_NE(apply_yaml({}, "polcy: kv_cost", "f.yaml").error().message.find("unknown option 'polcy'"), std::string::npos);
  EXPECT_NE(apply_yaml({}, "workers: http://x:1", "f.yaml").error().message.find("must be a list"), std::string::npos);
  EXPECT_NE(apply_yaml({}, "a: [", "f.yaml").error().message.find("f.yaml"), std::string::npos);
}

TEST(Config, HelpListsEveryOptionAndPolicy) {
  const std::string h = help_text();
  for (const char* s : {"--config", "--listen", "--admin-listen", "--worker", "--policy", "--session-header",
                        "--health-interval", "kv_cost", "chwbl", "round_robin"}) {
    EXPECT_NE(h.find(s), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace kvroute::router
