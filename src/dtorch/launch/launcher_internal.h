// What the launcher's two paths share: launcher.cpp (the entry, and a job of one node) and
// launcher_rounds.cpp (jobs of several nodes, or elastic ones, in rounds).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "dtorch/launch/launcher.h"
#include "dtorch/launch/launcher_output.h"
#include "dtorch/launch/worker_supervision.h"

namespace dtorch::launch {

/// The fewest nodes the job runs with: MIN of --nnodes=MIN:MAX, else --nnodes.
int min_nodes(const LaunchOptions& o);

// A static job's connection to node 0's store. Every node's launcher, node 0's included,
// connects through --master-addr as its workers will: an address that does not reach node 0
// fails here, by name, before any worker starts.
c10::intrusive_ptr<c10d::Store> connect_to_node_zero(const Plan& plan);

// Where a store this launcher serves for clients that reach it through `host` listens (Note
// [Where the store listens]), saying so when that is every interface though not asked.
std::string listen_address(const LaunchOptions& o, const std::string& host, Console& console);

// The exit code of a group the launcher itself stopped (a signal it got, or --timeout).
int stopped_by_launcher(const AttemptEnd& end, const LaunchOptions& o, Console& console);

// The exit code of a group whose workers checkpointed on the checkpoint signal (Note
// [Checkpoint on a signal]); node 0 first puts a Slurm job back in the queue when asked.
int checkpointed(const Plan& plan, Console& console);

/// Runs a job of several nodes, or an elastic one, in rounds (Note [One rendezvous for
/// launchers] in launcher_rounds.cpp); `served`: the store node 0 of a static job serves.
int run_rounds(const Plan& base, Console& console, c10::intrusive_ptr<c10d::Store> served);

}  // namespace dtorch::launch
