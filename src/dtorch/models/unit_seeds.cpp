// Note [Unit seeds]: per-unit reseeding of the global CPU generator.
#include "dtorch/models/unit_seeds.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "dtorch/core/storage.h"

namespace dtorch::models {
namespace {

/// SplitMix64's finaliser: nearby inputs give unrelated seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

thread_local bool deferred_storage = false;

}  // namespace

DeferredStorage::DeferredStorage() : outer_(deferred_storage) {
  deferred_storage = true;
}

DeferredStorage::~DeferredStorage() {
  deferred_storage = outer_;
}

UnitSeeds::UnitSeeds(const torch::nn::Module& model) : model_(model) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  base_ = gen.get<at::CPUGeneratorImpl>()->random64();
}

void UnitSeeds::enter(int unit) const {
  if (deferred_storage) release_parameters(model_);  // Note [Deferred initialisation]
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix(base_ ^ mix(static_cast<uint64_t>(unit) + 1)));
}

void release_parameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    if (holds_storage(p)) release_storage(p);
}

at::Tensor cpu_generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_generator_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

GeneratorStateGuard::GeneratorStateGuard() : state_(cpu_generator_state()) {}

GeneratorStateGuard::~GeneratorStateGuard() {
  set_cpu_generator_state(state_);
}

}  // namespace dtorch::models
