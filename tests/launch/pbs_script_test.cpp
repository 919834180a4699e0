// examples/pbs/train.pbs run as PBS would run it on one node: PBS's variables and node file, and
// a stand-in for Cray PALS's mpiexec that starts its copies with PALS's variables (no PBS or
// PALS exists on Debian; their variables are the ones recorded on Derecho and Polaris).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "launch/scoped_env.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;

// mpiexec -n N --ppn 1 [--depth D --cpu-bind B] PROGRAM...: N copies, one per "node", each with
// the variables PALS gives it.
const char* const kFakePalsMpiexec = R"(#!/bin/bash
n=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -n|--np|--ppn|--depth|--cpu-bind) [[ $1 == -n || $1 == --np ]] && n=$2; shift 2 ;;
    *) shift ;;
  esac
done
pids=()
for ((i = 0; i < n; i++)); do
  PALS_APID=fake-$$ PALS_RANKID=$i PALS_LOCAL_RANKID=0 PALS_NODEID=$i PALS_LOCAL_SIZE=1 \
  PMI_RANK=$i PMI_SIZE=$n PMI_LOCAL_RANK=0 PMI_LOCAL_SIZE=1 "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
)";

TEST(PbsScript, RunsOnOneNodeWithPalsStyleMpiexec) {
  testing::ScopedEnv env;
  std::string dir = testing::scratch_dir("pbs_script");
  std::string bin = dir + "/bin";
  ::mkdir(bin.c_str(), 0755);
  std::ofstream(bin + "/mpiexec") << kFakePalsMpiexec;
  ::chmod((bin + "/mpiexec").c_str(), 0755);
  std::string nodefile = dir + "/nodefile";
  std::ofstream(nodefile) << "localhost\nlocalhost\n";  // select=1:...:mpiprocs=2
  auto r = testing::run_command(
      "pbs_script_cmd", {"/bin/bash", std::string(DTORCH_SOURCE_DIR) + "/examples/pbs/train.pbs"},
      90,
      {"PATH=" + bin + ":/usr/bin:/bin", "PBS_JOBID=4242.desched1", "PBS_NODEFILE=" + nodefile,
       "PBS_O_WORKDIR=" + dir, std::string("DTORCH=") + DTORCH_CLI, "OUT=" + dir + "/run",
       "NPROC_PER_NODE=2", "OMP_NUM_THREADS=1",
       "TRAIN_ARGS=--train-samples 512 --test-samples 256 --epochs 1 --progress lines"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "2 rank(s) on each of 1 node(s)")) << r.out;
  EXPECT_TRUE(contains(r.err, "nodes from Cray PALS (PALS_RANKID=0, PMI_SIZE=1)")) << r.err;
  EXPECT_TRUE(contains(r.err, "[n0 r0]")) << r.err;
  EXPECT_TRUE(contains(r.err, "2 rank(s)")) << r.err;
  std::string metrics = testing::read_file(dir + "/run/metrics.jsonl");
  EXPECT_TRUE(contains(metrics, "\"test_accuracy\"")) << metrics;
}

}  // namespace
}  // namespace dtorch
