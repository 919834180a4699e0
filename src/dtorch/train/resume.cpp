// Resuming a run (resume.h).
#include "dtorch/train/resume.h"

#include <cstdlib>
#include <vector>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::train {
namespace {

// ZeRO-1/2 under --tp N write their shards per tp index (Note [Tensor-parallel checkpoints]
// in strategy/ddp_strategy.cpp) and resume only as ZeRO at the same N: checked here, so that
// another layout never starts silently from scratch. DDP's tensor-parallel checkpoints are whole
// and fit any --tp.
void check_tensor_parallel_layout(const TrainConfig& c) {
  int saved_tp = 1;
  std::error_code ec;
  // In the run's folder, or in its pipeline stage folders (Note [Pipeline checkpoints]).
  std::vector<std::string> folders{c.checkpointing.out};
  for (const std::string& name : paths::list_directory(c.checkpointing.out, ec))
    if (name.rfind("pp", 0) == 0) folders.push_back(paths::join(c.checkpointing.out, name));
  for (const auto& folder : folders) {
    for (const std::string& name : paths::list_directory(folder, ec)) {
      auto of = name.find("-of-");
      if (name.rfind("tp", 0) == 0 && of != std::string::npos) {
        saved_tp = std::atoi(name.c_str() + of + 4);
      }
    }
  }
  if (saved_tp == 1) return;  // no per-tp folders: no tensor parallelism, or ddp's whole files
  DTORCH_CHECK_T(CheckpointError,
                 saved_tp == c.parallelism.tp && c.strategy.kind != StrategyKind::DDP,
                 "the ZeRO checkpoints in ", c.checkpointing.out, " were written with --tp ",
                 saved_tp, " and this run has --tp ", c.parallelism.tp, " (",
                 name_of(c.strategy.kind), "): resume with --strategy zero1 or zero2 and --tp ",
                 saved_tp, " (only ddp's tensor-parallel checkpoints fit any --tp)");
}

}  // namespace

std::optional<Schedule> schedule_of(const std::string& metadata_json, const std::string& path) {
  auto meta = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!meta.is_object() || !meta.contains("lr_schedule")) return std::nullopt;
  try {
    const auto& j = meta.at("lr_schedule");
    Schedule s;
    j.get_to(s.config);
    s.lr = j.at("lr").get<double>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    validate(s.config, s.lr, s.total_steps);
    return s;
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, "the learning-rate schedule recorded in ", path,
                " is unreadable (", e.what(), "); resume from another checkpoint, or start a new ",
                "run in another --out");
  }
}

std::string config_json(const TrainConfig& c, int world, const Schedule& schedule,
                        const models::ImageInput& input) {
  nlohmann::json j = {
      {"model", c.model.name},
      {"config", to_json(c)},
      {"input", {{"channels", input.channels}, {"size", input.size}, {"classes", input.classes}}},
      {"world_size", world},
      {"lr_schedule", schedule.to_json()}};
  return j.dump();
}

std::string with_epoch_progress(const std::string& metadata_json, const EpochProgress& p) {
  nlohmann::json j = nlohmann::json::parse(metadata_json);
  j["epoch_progress"] = {{"batches", p.batches},
                         {"loss_sum", p.tally.sum()},
                         {"loss_batches", p.tally.batches},
                         {"samples", p.tally.samples}};
  return j.dump();
}

EpochProgress epoch_progress_of(const std::string& metadata_json, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!j.is_object() || !j.contains("epoch_progress")) return {};
  const nlohmann::json& p = j["epoch_progress"];
  const bool ok = p.is_object() && p.value("batches", nlohmann::json()).is_number_unsigned() &&
                  p.value("loss_sum", nlohmann::json()).is_number() &&
                  p.value("loss_batches", nlohmann::json()).is_number_unsigned() &&
                  p.value("samples", nlohmann::json()).is_number_unsigned() &&
                  p["batches"].get<int64_t>() > 0;
  DTORCH_CHECK_T(CheckpointError, ok, path, ": its record of the epoch it stopped in (",
                 p.dump().substr(0, 200),
                 ") is not what dtorch writes; resume from an earlier checkpoint (move this one "
                 "away)");
  return {p["batches"].get<int64_t>(),
          LossTally::resumed(p["loss_sum"].get<double>(), p["loss_batches"].get<int64_t>(),
                             p["samples"].get<int64_t>())};
}

bool continues_run(const TrainConfig& c, const launch::RankInfo& job) {
  // A group the launcher restarted (--max-restarts), or started again in a later round of an
  // elastic job (a node came or went, Note [Elastic rendezvous]), or a Slurm job requeued after
  // it checkpointed (Note [Checkpoint on a signal]) resumes by itself, as torchrun scripts
  // reload their snapshot: the checkpoints in `out` are this job's own.
  return c.checkpointing.resume || job.restart_count > 0 ||
         env::get_int("DTORCH_ELASTIC_ROUND").value_or(0) > 0 ||
         env::get_int("SLURM_RESTART_COUNT").value_or(0) > 0;
}

StartPoint resume_run(const TrainConfig& c, Strategy& strategy, comm::Communicator& comm,
                      const Schedule& schedule, bool lead) {
  StartPoint start{0, 0, schedule, false, {}};
  const int restart = comm.info().restart_count;
  const int64_t round = env::get_int("DTORCH_ELASTIC_ROUND").value_or(0);
  start.resumed = continues_run(c, comm.info());
  if (lead && restart > 0) {
    log::info("restart ", restart, " of the group: resuming from ", c.checkpointing.out);
  } else if (lead && round > 0) {
    log::info("elastic round ", round, ": resuming from ", c.checkpointing.out);
  } else if (const int64_t requeued = env::get_int("SLURM_RESTART_COUNT").value_or(0);
             lead && requeued > 0 && !c.checkpointing.resume) {
    log::info("Slurm requeued the job (SLURM_RESTART_COUNT=", requeued, "): resuming from ",
              c.checkpointing.out);
  }
  if (!start.resumed) return start;
  check_tensor_parallel_layout(c);
  if (auto ck = strategy.load_latest(c.checkpointing.out)) {
    start.epoch = ck->data.epoch;
    start.global_step = ck->data.global_step;
    start.within = epoch_progress_of(ck->data.metadata_json, ck->path);
    if (start.within.batches > 0) {
      --start.epoch;  // Note [Checkpoint on a signal]: named after the epoch it stopped in
      if (lead) {
        log::info("resuming from ", ck->path, " inside epoch ", start.epoch + 1, ", after ",
                  start.within.batches, " of its batches (step ", start.global_step, ")");
      }
    } else if (lead) {
      log::info("resuming from ", ck->path, " (", start.epoch, " epoch(s) done)");
    }
    // The saved schedule goes on where it stopped, whatever the flags say now.
    if (auto saved = schedule_of(ck->data.metadata_json, ck->path)) {
      if (lead && !(*saved == schedule)) {
        log::info("the checkpoint's learning-rate schedule continues: ",
                  describe(saved->config, saved->lr, saved->total_steps),
                  " (this run's flags would give ",
                  describe(schedule.config, schedule.lr, schedule.total_steps), ")");
      }
      start.schedule = *saved;
    }
  } else if (lead) {
    log::info("--resume: no checkpoint in ", c.checkpointing.out, ", starting from scratch");
  }
  // Every rank must resume from the same epoch, or their steps would not match.
  auto e = torch::tensor({double(start.epoch), -double(start.epoch)}, torch::kDouble);
  comm.allreduce(e, comm::ReduceOp::Max, "resume epoch check");
  DTORCH_CHECK_T(CheckpointError, e[0].item<double>() == -e[1].item<double>(),
                 "ranks found different checkpoints in ", c.checkpointing.out,
                 " (is --out on a file system every node shares?)");
  return start;
}

}  // namespace dtorch::train
