// A communicator kept in an autograd context: the parallelisms' autograd functions (tensor-
// parallel regions, context-parallel attention) make collectives in backward over the group
// their forward used, and hold it as a capsule in ctx->saved_data, so that a graph keeps its
// group alive until backward has run.
#pragma once

#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>

#include "dtorch/comm/communicator.h"

namespace dtorch::parallel {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<comm::Communicator> c) : comm(std::move(c)) {}
  std::shared_ptr<comm::Communicator> comm;
};

/// Stores `group` in `ctx` under `key`.
inline void keep_group(torch::autograd::AutogradContext* ctx, const std::string& key,
                       std::shared_ptr<comm::Communicator> group) {
  ctx->saved_data[key] =
      c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(std::move(group)));
}

/// The group keep_group stored under `key`.
inline std::shared_ptr<comm::Communicator> kept_group(torch::autograd::AutogradContext* ctx,
                                                      const std::string& key) {
  return c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data[key].toCapsule())->comm;
}

}  // namespace dtorch::parallel
