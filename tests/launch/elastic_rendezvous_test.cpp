// Note [Elastic rendezvous] on an in-memory store, one thread per launcher: numbering on
// arrival, closing at MIN when nobody else is alive, a late node joining at the next round,
// lost nodes, --max-restarts, the join timeout's message, and the store's host waiting (boundedly)
// for the others to leave; a static job's rounds, with node ranks given and MIN = MAX.
#include "dtorch/launch/elastic_rendezvous.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <thread>

#include "dtorch/core/error.h"
#include "dtorch/launch/store.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  c10::intrusive_ptr<c10d::HashStore> store = c10::make_intrusive<c10d::HashStore>();
  ElasticConfig cfg;
  Job(int lo, int hi, int max_restarts = 3) {
    cfg.run_id = "test";
    cfg.min_nodes = lo;
    cfg.max_nodes = hi;
    cfg.max_restarts = max_restarts;
    cfg.conf.join_timeout = 5;
    cfg.conf.last_call_timeout = 0.3;
    cfg.conf.keep_alive_interval = 0.05;
    cfg.conf.keep_alive_max_attempt = 4;
  }
  std::unique_ptr<ElasticRendezvous> launcher(const std::string& host, int node_rank = -1) {
    ElasticConfig c = cfg;
    c.host = host;
    c.node_rank = node_rank;
    c10::intrusive_ptr<c10d::Store> s = store;
    return std::make_unique<ElasticRendezvous>(
        s, [s] { return s; }, c);
  }
};

std::vector<Round> join_all(std::vector<std::unique_ptr<ElasticRendezvous>>& nodes) {
  std::vector<std::future<std::optional<Round>>> f;
  for (auto& n : nodes)
    f.push_back(std::async(std::launch::async, [&n] { return n->join(); }));
  std::vector<Round> rounds;
  for (auto& x : f) {
    auto r = x.get();
    EXPECT_TRUE(r.has_value());
    if (r) rounds.push_back(*r);
  }
  return rounds;
}

// Polls as a launcher does while its workers run, for at most 4 s.
std::optional<RoundEnd> poll_until_the_round_ends(ElasticRendezvous& node) {
  std::optional<RoundEnd> end;
  for (int i = 0; i < 200 && !end; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    end = node.poll();
  }
  return end;
}

TEST(ElasticRendezvous, NodesAreNumberedOnArrivalAndSeeTheSameRoll) {
  Job job(2, 3);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  for (const char* h : {"hostA", "hostB", "hostC"})
    nodes.push_back(job.launcher(h));
  auto t0 = Clock::now();
  std::vector<Round> rounds = join_all(nodes);
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << "MAX came: no last call";
  std::set<int> ranks;
  for (const Round& r : rounds) {
    EXPECT_EQ(r.number, 0);
    EXPECT_EQ(r.nnodes, 3);
    EXPECT_EQ(r.hosts, rounds[0].hosts);
    EXPECT_EQ(r.restarts, 0);
    ranks.insert(r.node_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(rounds[i].hosts[static_cast<std::size_t>(rounds[i].node_rank)],
              std::string("host") + char('A' + i));
}

TEST(ElasticRendezvous, TheFirstRoundWaitsItsLastCallALaterOneOnlyForTheLiving) {
  Job job(2, 4);
  job.cfg.conf.last_call_timeout = 1;
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA"));
  nodes.push_back(job.launcher("hostB"));
  auto t0 = Clock::now();
  std::vector<Round> rounds = join_all(nodes);
  // At the start more nodes may still come: MIN came, then the last call.
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(950));
  for (const Round& r : rounds)
    EXPECT_EQ(r.nnodes, 2);
  nodes[0]->end_round(RoundCause::Failure, "rank 0 exited with code 1");
  t0 = Clock::now();
  rounds = join_all(nodes);
  // Both launchers alive came: no one else to wait for.
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(700));
  for (const Round& r : rounds) {
    EXPECT_EQ(r.number, 1);
    EXPECT_EQ(r.nnodes, 2);
  }
}

TEST(ElasticRendezvous, ALateNodeJoinsAtTheNextRound) {
  Job job(2, 3);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA"));
  nodes.push_back(job.launcher("hostB"));
  join_all(nodes);
  nodes.push_back(job.launcher("hostC"));
  auto late = std::async(std::launch::async, [&] { return nodes[2]->join(); });
  std::optional<RoundEnd> end = poll_until_the_round_ends(*nodes[0]);
  ASSERT_TRUE(end.has_value()) << "the running nodes never saw hostC waiting";
  EXPECT_FALSE(end->fail);
  EXPECT_NE(end->why.find("a node (hostC) asks to join the 2 running, up to 3"), std::string::npos)
      << end->why;
  auto b = nodes[1]->poll();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->why, end->why) << "every node reads the same verdict";
  auto a = std::async(std::launch::async, [&] { return nodes[0]->join(); });
  auto bb = std::async(std::launch::async, [&] { return nodes[1]->join(); });
  std::vector<std::optional<Round>> rounds = {a.get(), bb.get(), late.get()};
  std::set<int> ranks;
  for (const auto& r : rounds) {
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->number, 1);
    EXPECT_EQ(r->nnodes, 3);
    EXPECT_EQ(r->restarts, 0) << "a join is not a failure";
    ranks.insert(r->node_rank);
  }
  EXPECT_EQ(ranks.size(), 3u);
}

TEST(ElasticRendezvous, ALostNodeRestartsTheRoundOnTheNodesLeft) {
  Job job(2, 3);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  for (const char* h : {"hostA", "hostB", "hostC"})
    nodes.push_back(job.launcher(h));
  std::vector<Round> rounds = join_all(nodes);
  std::string lost_host = rounds[2].hosts[static_cast<std::size_t>(rounds[2].node_rank)];
  nodes[2].reset();  // its launcher ends without finishing
  std::optional<RoundEnd> end = poll_until_the_round_ends(*nodes[0]);
  ASSERT_TRUE(end.has_value());
  EXPECT_FALSE(end->fail) << end->why;
  EXPECT_NE(
      end->why.find("lost node " + std::to_string(rounds[2].node_rank) + " (" + lost_host + ")"),
      std::string::npos)
      << end->why;
  nodes.pop_back();
  std::vector<Round> again = join_all(nodes);
  for (const Round& r : again) {
    EXPECT_EQ(r.number, 1);
    EXPECT_EQ(r.nnodes, 2);
    EXPECT_EQ(r.restarts, 1) << "a lost node counts against --max-restarts";
  }
}

TEST(ElasticRendezvous, FewerThanMinLeftFailsNamingTheLostNode) {
  Job job(3, 3);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  for (const char* h : {"hostA", "hostB", "hostC"})
    nodes.push_back(job.launcher(h));
  std::vector<Round> rounds = join_all(nodes);
  nodes[1].reset();
  std::optional<RoundEnd> end = poll_until_the_round_ends(*nodes[2]);
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->fail);
  EXPECT_NE(end->why.find("(hostB)"), std::string::npos) << end->why;
  EXPECT_NE(end->why.find("2 node(s) left, fewer than --nnodes MIN 3"), std::string::npos)
      << end->why;
}

TEST(ElasticRendezvous, FailuresBeyondMaxRestartsEndTheJob) {
  Job job(1, 2, /*max_restarts=*/1);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA"));
  nodes.push_back(job.launcher("hostB"));
  join_all(nodes);
  RoundEnd first = nodes[0]->end_round(RoundCause::Failure, "rank 1 exited with code 3");
  EXPECT_FALSE(first.fail);
  EXPECT_EQ(nodes[1]->poll()->why, "rank 1 exited with code 3");
  std::vector<Round> again = join_all(nodes);
  EXPECT_EQ(again[0].restarts, 1);
  RoundEnd second = nodes[1]->end_round(RoundCause::Failure, "rank 0 exited with code 3");
  EXPECT_TRUE(second.fail);
  EXPECT_NE(second.why.find("giving up: the job already restarted 1 time(s) (--max-restarts)"),
            std::string::npos)
      << second.why;
}

TEST(ElasticRendezvous, TheStoresHostWaitsUntilEveryOtherLauncherHasLeft) {
  Job job(3, 3);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  for (const char* h : {"hostA", "hostB", "hostC"})
    nodes.push_back(job.launcher(h));
  join_all(nodes);
  nodes[2].reset();
  std::optional<RoundEnd> end = poll_until_the_round_ends(*nodes[1]);
  ASSERT_TRUE(end.has_value());
  ASSERT_TRUE(end->fail) << end->why;
  // hostB has the verdict in hand but has not left: hostA, serving the store, keeps it. (A
  // flag, not a future's wait_for: Note [libstdc++ symbols LibTorch exports].)
  std::atomic<bool> done{false};
  std::thread waiting([&] {
    nodes[0]->wait_for_peers(10);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(done) << "hostA stopped waiting while hostB was still there";
  auto left = Clock::now();
  nodes[1].reset();
  while (!done && std::chrono::duration<double>(Clock::now() - left).count() < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(done) << "hostA still waits 5 s after hostB left";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - left).count(), 2);
  waiting.join();
}

TEST(ElasticRendezvous, WaitingForTheOthersToLeaveIsBounded) {
  Job job(1, 2);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA"));
  nodes.push_back(job.launcher("hostB"));
  join_all(nodes);
  auto start = Clock::now();
  nodes[0]->wait_for_peers(0.4);  // hostB beats and stays
  double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(took, 0.4);
  EXPECT_LT(took, 2);
}

TEST(ElasticRendezvous, TheJoinTimeoutNamesWhoCame) {
  Job job(2, 2);
  job.cfg.conf.join_timeout = 0.3;
  auto only = job.launcher("hostA");
  try {
    only->join();
    FAIL() << "no error";
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rendezvous failed after 0.3 s"), std::string::npos) << m;
    EXPECT_NE(m.find("1 of at least 2 node(s) arrived (hostA)"), std::string::npos) << m;
  }
}

// Note [One job per store]: a launcher of another --rdzv-id that reaches the store is refused
// before it writes any of the job's keys, and the job's own launchers go on.
TEST(ElasticRendezvous, ALauncherOfAnotherJobIsRefused) {
  Job job(1, 2);
  job.cfg.endpoint = "node0:29400";
  auto first = job.launcher("a");
  Job other = job;
  other.cfg.run_id = "other";
  std::string why;
  try {
    other.launcher("stray");
  } catch (const CommError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("the rendezvous store at node0:29400 belongs to job 'test', not to this "
                     "launcher's job 'other' (--rdzv-id)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("each job its own --master-port"), std::string::npos) << why;
  EXPECT_EQ(job.store->add("dtorch/rdzv/test/launchers", 0), 1) << "the stray was never counted";
  EXPECT_FALSE(job.store->check({"dtorch/rdzv/other/launchers"}));
  auto second = job.launcher("b");  // the job's own still join
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(std::move(first));
  nodes.push_back(std::move(second));
  EXPECT_EQ(join_all(nodes).size(), 2u);

  // A worker checks the job, and joins a store nobody claimed (PyTorch's torchrun serves it).
  EXPECT_NO_THROW(check_store_job(*job.store, "test", "node0:29400"));
  why = "";
  try {
    check_store_job(*job.store, "other", "node0:29400");
  } catch (const CommError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("belongs to job 'test', but this worker's TORCHELASTIC_RUN_ID is 'other'"),
            std::string::npos)
      << why;
  EXPECT_NO_THROW(check_store_job(*c10::make_intrusive<c10d::HashStore>(), "x", "h:1"));
}

// A static job (Note [One rendezvous for launchers]): node ranks given, MIN = MAX.
TEST(StaticRounds, NodesMeetAtTheirGivenRanksAndSeeEachOthersHosts) {
  Job job(2, 2);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostB", 1));  // node 1 comes first: ranks are not arrivals
  nodes.push_back(job.launcher("hostA", 0));
  std::vector<Round> rounds = join_all(nodes);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].node_rank, 1);
  EXPECT_EQ(rounds[1].node_rank, 0);
  for (const Round& r : rounds) {
    EXPECT_EQ(r.number, 0);
    EXPECT_EQ(r.nnodes, 2);
    EXPECT_EQ(r.hosts, (std::vector<std::string>{"hostA", "hostB"}));
  }
}

TEST(StaticRounds, MissingNodesAreNamedByRankAfterTheTimeoutWhileTheWaitSaysSo) {
  Job job(4, 4);
  job.cfg.conf.join_timeout = 0.3;
  job.cfg.join_timeout_flag = "--rdzv-timeout";
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA", 0));
  nodes.push_back(job.launcher("hostC", 2));
  std::vector<std::future<std::string>> errors;
  for (auto& n : nodes) {
    errors.push_back(std::async(std::launch::async, [&n] {
      try {
        n->join();
      } catch (const CommError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }));
  }
  for (auto& e : errors) {
    const std::string m = e.get();
    EXPECT_NE(m.find("rendezvous failed after 0.3 s (--rdzv-timeout): 2 of 4 node(s) arrived "
                     "(node 0 on hostA, node 2 on hostC); missing node rank(s): 1, 3"),
              std::string::npos)
        << m;
  }
}

TEST(StaticRounds, ARankGivenTwiceIsRefusedNamingWhoHasIt) {
  Job job(2, 2);
  job.cfg.conf.join_timeout = 0.5;
  auto first = job.launcher("hostA", 1);
  auto second = job.launcher("hostB", 1);
  std::thread t([&] { EXPECT_THROW(first->join(), CommError); });  // node 0 never comes
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  try {
    second->join();
    FAIL() << "no error";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node rank 1 is taken: the launcher on hostA joined this job with "
                     "--node-rank 1 first"),
              std::string::npos)
        << m;
  }
  t.join();
}

TEST(StaticRounds, AFailedWorkerRestartsEveryNodeTogetherUntilMaxRestarts) {
  Job job(2, 2, /*max_restarts=*/1);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA", 0));
  nodes.push_back(job.launcher("hostB", 1));
  join_all(nodes);
  EXPECT_FALSE(nodes[1]->end_round(RoundCause::Failure, "rank 3 exited with code 1").fail);
  std::optional<RoundEnd> seen = poll_until_the_round_ends(*nodes[0]);
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->why, "rank 3 exited with code 1") << "node 0 stops its workers too";
  std::vector<Round> again = join_all(nodes);
  ASSERT_EQ(again.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again[i].number, 1);
    EXPECT_EQ(again[i].node_rank, static_cast<int>(i)) << "ranks stay as given";
    EXPECT_EQ(again[i].restarts, 1);
  }
  RoundEnd last = nodes[0]->end_round(RoundCause::Failure, "rank 0 exited with code 1");
  EXPECT_TRUE(last.fail);
  EXPECT_TRUE(poll_until_the_round_ends(*nodes[1])->fail);
}

TEST(StaticRounds, ALostNodeEndsTheJobOnTheOthers) {
  Job job(2, 2);
  std::vector<std::unique_ptr<ElasticRendezvous>> nodes;
  nodes.push_back(job.launcher("hostA", 0));
  nodes.push_back(job.launcher("hostB", 1));
  join_all(nodes);
  nodes[1].reset();  // its launcher ends without finishing
  std::optional<RoundEnd> end = poll_until_the_round_ends(*nodes[0]);
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->fail);
  EXPECT_NE(end->why.find("lost node 1 (hostB)"), std::string::npos) << end->why;
  EXPECT_NE(end->why.find("the job needs all 2 nodes (--nnodes 2"), std::string::npos) << end->why;
}

}  // namespace
}  // namespace dtorch::launch
