// Unit tests of launcher/multihost/slurm.h: the hostlist parser and a job step's environment read into the
// node's options, with every refusal's message.
#include "launcher/multihost/slurm.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Hosts(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ParseHostlist(list);
  EXPECT_TRUE(hosts.ok()) << list << ": " << hosts.status();
  return hosts.ok() ? *hosts : std::vector<std::string>{};
}

std::string ParseError(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ParseHostlist(list);
  EXPECT_FALSE(hosts.ok()) << list;
  EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(hosts.status().message());
}

TEST(ParseHostlistTest, PlainNames_InOrder) {
  EXPECT_THAT(Hosts("gpu07"), ElementsAre("gpu07"));
  EXPECT_THAT(Hosts("b,a,c"), ElementsAre("b", "a", "c"));
}

TEST(ParseHostlistTest, RangesAndSingles_ExpandInOrder) {
  EXPECT_THAT(Hosts("n[1-3,5],gpu07"), ElementsAre("n1", "n2", "n3", "n5", "gpu07"));
}

TEST(ParseHostlistTest, ZeroPaddedRange_KeepsTheWidthOfItsFirstNumber) {
  EXPECT_THAT(Hosts("node[08-11]"), ElementsAre("node08", "node09", "node10", "node11"));
  EXPECT_THAT(Hosts("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(Hosts("n[001-002]"), ElementsAre("n001", "n002"));
}

TEST(ParseHostlistTest, SeveralBrackets_EveryCombinationLastFastest) {
  EXPECT_THAT(Hosts("rack[1-2]-n[1-2]"), ElementsAre("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"));
}

TEST(ParseHostlistTest, SuffixAfterBracket_IsKept) {
  EXPECT_THAT(Hosts("n[1-2].cluster,login"), ElementsAre("n1.cluster", "n2.cluster", "login"));
}

TEST(ParseHostlistTest, SurroundingWhitespace_IsIgnored) { EXPECT_THAT(Hosts(" n[1-2]\n"), ElementsAre("n1", "n2")); }

TEST(ParseHostlistTest, Malformed_IsInvalidArgumentSayingWhat) {
  EXPECT_THAT(ParseError(""), HasSubstr("empty"));
  EXPECT_THAT(ParseError("n[1-3"), HasSubstr("unbalanced"));
  EXPECT_THAT(ParseError("n1-3]"), HasSubstr("unbalanced"));
  EXPECT_THAT(ParseError("n[[1]]"), HasSubstr("nested"));
  EXPECT_THAT(ParseError("n[3-1]"), HasSubstr("backwards"));
  EXPECT_THAT(ParseError("n[a-b]"), HasSubstr("decimal numbers"));
  EXPECT_THAT(ParseError("n[]"), HasSubstr("decimal numbers"));
  EXPECT_THAT(ParseError("n[1-2,]"), HasSubstr("decimal numbers"));
  EXPECT_THAT(ParseError("a,,b"), HasSubstr("empty host name"));
  EXPECT_THAT(ParseError("a b"), HasSubstr("unexpected character ' '"));
  EXPECT_THAT(ParseError("n[1-999999]"), HasSubstr("over 100000 hosts"));
  EXPECT_THAT(ParseError("a[1-1000]b[1-1000]"), HasSubstr("over 100000 hosts"));
}

TEST(SlurmCoordinatorPortTest, IsBasePlusJobIdModTenThousand) {
  EXPECT_EQ(SlurmCoordinatorPort(0), 29500);
  EXPECT_EQ(SlurmCoordinatorPort(1234), 30734);
  EXPECT_EQ(SlurmCoordinatorPort(19999), 39499);
  EXPECT_EQ(SlurmCoordinatorPort(20000), 29500);
}

// What srun gives the task on the second of two nodes.
std::map<std::string, std::string> StepEnv() {
  return {{"SLURM_JOB_ID", "1234"},
          {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_NODEID", "1"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_PROCID", "1"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NTASKS", "2"}};
}

NodeOptions Read(const std::map<std::string, std::string>& env, const SlurmOptions& options = {}) {
  absl::StatusOr<NodeOptions> node = NodeOptionsFromSlurm(env, options);
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? *node : NodeOptions{};
}

absl::Status ReadError(const std::map<std::string, std::string>& env, const SlurmOptions& options = {}) {
  absl::StatusOr<NodeOptions> node = NodeOptionsFromSlurm(env, options);
  EXPECT_FALSE(node.ok());
  return node.status();
}

TEST(NodeOptionsFromSlurmTest, TwoNodeStep_GivesCountRankAndFirstHostOnDerivedPort) {
  NodeOptions node = Read(StepEnv());
  EXPECT_EQ(node.nodes, 2);
  EXPECT_EQ(node.node_rank, 1);
  EXPECT_EQ(node.coordinator_address, "n1:30734");
  EXPECT_EQ(node.node_name, "n2");  // its entry in the list, without SLURMD_NODENAME
  EXPECT_FALSE(node.gpus.has_value());
  EXPECT_FALSE(node.cuda_visible_devices.has_value());
}

TEST(NodeOptionsFromSlurmTest, PortFlag_OverridesTheDerivedPort) {
  EXPECT_EQ(Read(StepEnv(), {.coordinator_port = 4000}).coordinator_address, "n1:4000");
  EXPECT_THAT(ReadError(StepEnv(), {.coordinator_port = 70000}).message(), HasSubstr("pass 1 to 65535"));
}

TEST(NodeOptionsFromSlurmTest, StepSmallerThanAllocation_StepVariablesWin) {
  auto env = StepEnv();
  env["SLURM_NNODES"] = "4";
  env["SLURM_JOB_NODELIST"] = "n[1-4]";
  env["SLURM_STEP_NUM_NODES"] = "1";
  env["SLURM_STEP_NODELIST"] = "n3";
  env["SLURM_NODEID"] = "0";
  env["SLURM_STEP_NUM_TASKS"] = "1";
  NodeOptions node = Read(env);
  EXPECT_EQ(node.nodes, 1);
  EXPECT_EQ(node.coordinator_address, "n3:30734");
}

TEST(NodeOptionsFromSlurmTest, JobVariablesOnly_AreUsed) {
  std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "7"}, {"SLURM_NNODES", "3"}, {"SLURM_JOB_NODELIST", "gpu[07-08],login"}, {"SLURM_NODEID", "2"}};
  NodeOptions node = Read(env);
  EXPECT_EQ(node.nodes, 3);
  EXPECT_EQ(node.node_rank, 2);
  EXPECT_EQ(node.coordinator_address, "gpu07:29507");
}

TEST(NodeOptionsFromSlurmTest, NoJobId_IsFailedPreconditionSayingRunUnderSrun) {
  absl::Status s = ReadError({{"HOME", "/root"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--slurm outside a Slurm job: SLURM_JOB_ID is not set; run it under srun"));
}

TEST(NodeOptionsFromSlurmTest, BatchScriptWithoutStep_SaysStartWithSrun) {
  auto env = StepEnv();
  env.erase("SLURM_NODEID");
  absl::Status s = ReadError(env);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("srun --ntasks-per-node=1 launcher --slurm"));
}

TEST(NodeOptionsFromSlurmTest, TwoTasksPerNode_IsRefusedNamingNtasksPerNode) {
  auto env = StepEnv();
  env["SLURM_STEP_NUM_TASKS"] = "4";
  EXPECT_THAT(ReadError(env).message(), HasSubstr("4 tasks on 2 nodes; --slurm runs one launcher per node"));
  env = StepEnv();
  env["SLURM_LOCALID"] = "1";
  EXPECT_THAT(ReadError(env).message(), HasSubstr("--ntasks-per-node=1"));
}

TEST(NodeOptionsFromSlurmTest, NodeListDisagreesWithCount_IsInvalidArgument) {
  auto env = StepEnv();
  env["SLURM_STEP_NODELIST"] = "n[1-3]";
  absl::Status s = ReadError(env);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("names 3 hosts but the step has 2 nodes"));
}

TEST(NodeOptionsFromSlurmTest, NodeIdOutOfRangeOrNotANumber_IsInvalidArgument) {
  auto env = StepEnv();
  env["SLURM_NODEID"] = "2";
  EXPECT_THAT(ReadError(env).message(), HasSubstr("SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"));
  env["SLURM_NODEID"] = "x";
  EXPECT_THAT(ReadError(env).message(), HasSubstr("SLURM_NODEID=x is not a whole number"));
}

TEST(NodeOptionsFromSlurmTest, UnparsableList_UsesTheFallbackExpander) {
  auto env = StepEnv();
  env["SLURM_STEP_NODELIST"] = "n[1-2]{future}";
  SlurmOptions options;
  std::string asked;
  options.fallback = [&](const std::string& list) -> absl::StatusOr<std::vector<std::string>> {
    asked = list;
    return std::vector<std::string>{"x1", "x2"};
  };
  EXPECT_EQ(Read(env, options).coordinator_address, "x1:30734");
  EXPECT_EQ(asked, "n[1-2]{future}");
  options.fallback = [](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    return absl::UnavailableError("cannot run scontrol");
  };
  absl::Status s = ReadError(env, options);
  EXPECT_THAT(s.message(), HasSubstr("unexpected character '{'"));
  EXPECT_THAT(s.message(), HasSubstr("cannot run scontrol"));
}

TEST(NodeOptionsFromSlurmTest, GpusOnNode_IsTheCount) {
  auto env = StepEnv();
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  NodeOptions node = Read(env);
  EXPECT_EQ(node.gpus, 4);
  EXPECT_EQ(node.gpus_source, "SLURM_GPUS_ON_NODE");
  EXPECT_FALSE(node.cuda_visible_devices.has_value());  // Slurm set it already
}

TEST(NodeOptionsFromSlurmTest, GpusOnNodeBeyondVisible_IsRefusedNamingBoth) {
  auto env = StepEnv();
  env["SLURM_GPUS_ON_NODE"] = "4";
  env["CUDA_VISIBLE_DEVICES"] = "0,1";
  absl::Status s = ReadError(env);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("SLURM_GPUS_ON_NODE=4 but CUDA_VISIBLE_DEVICES=0,1 makes 2 visible"));
}

TEST(NodeOptionsFromSlurmTest, CudaVisibleDevicesOnly_CountsItsEntries) {
  auto env = StepEnv();
  env["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa,GPU-bbbb";
  EXPECT_EQ(Read(env).gpus, 2);
  env["CUDA_VISIBLE_DEVICES"] = "NoDevFiles";
  EXPECT_EQ(Read(env).gpus, 0);
}

TEST(NodeOptionsFromSlurmTest, JobGpusOnly_CountsThemAndRestrictsVisibility) {
  auto env = StepEnv();
  env["SLURM_JOB_GPUS"] = "2,3";
  NodeOptions node = Read(env);
  EXPECT_EQ(node.gpus, 2);
  EXPECT_EQ(node.gpus_source, "SLURM_JOB_GPUS");
  EXPECT_EQ(node.cuda_visible_devices, "2,3");
}

TEST(NodeOptionsFromSlurmTest, SlurmdNodeName_IsTheNodesName) {
  auto env = StepEnv();
  env["SLURMD_NODENAME"] = "gpu-b";
  EXPECT_EQ(Read(env).node_name, "gpu-b");
}

TEST(ExpandNodePatternTest, NameRankAndPercent_AreThisNodes) {
  NodeOptions node;
  node.node_rank = 3;
  node.node_name = "gpu07";
  absl::StatusOr<std::string> path = ExpandNodePattern("--tls_cert", "certs/%N-%n.pem", node);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, "certs/gpu07-3.pem");
  EXPECT_EQ(*ExpandNodePattern("--tls_ca", "certs/100%%/ca.pem", node), "certs/100%/ca.pem");
  EXPECT_EQ(*ExpandNodePattern("--tls_ca", "", node), "");
}

TEST(ExpandNodePatternTest, OtherSequences_AreInvalidArgumentNamingTheFlag) {
  for (const char* bad : {"certs/%j.pem", "certs/%"}) {
    absl::StatusOr<std::string> path = ExpandNodePattern("--tls_key", bad, NodeOptions{});
    ASSERT_FALSE(path.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(path.status()));
    EXPECT_THAT(path.status().message(), HasSubstr("--tls_key="));
    EXPECT_THAT(path.status().message(), HasSubstr("%N"));
  }
}

}  // namespace
}  // namespace stagehand
