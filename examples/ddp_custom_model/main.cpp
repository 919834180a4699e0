// Bring your own model: a plain LibTorch module trained data-parallel with dtorch's DDP.
// Run it on 2 local ranks:  dtorch launch --nproc-per-node 2 -- ./ddp_custom_model
// (or under torchrun, Slurm's srun with torchrun's variables, or alone as 1 rank). Built
// against a CUDA LibTorch on a GPU node, each rank takes the GPU its LOCAL_RANK names and
// gradients travel over NCCL:  dtorch launch --nproc-per-node gpu -- ./ddp_custom_model
#include <dtorch/dtorch.h>
#include <torch/torch.h>

#include <iostream>

// 1. Your model: any torch::nn::Module. Nothing dtorch-specific in it.
struct Regressor : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Regressor() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
};

int main() try {
  // 2. Join the job: rank and world size come from the launcher's environment.
  auto comm = dtorch::comm::Communicator::from_env();

  // One GPU per rank where there are GPUs (the launcher sets LOCAL_RANK), else the CPU.
  torch::Device device = torch::cuda::is_available()
                             ? torch::Device(torch::kCUDA, comm->info().local_rank)
                             : torch::Device(torch::kCPU);

  // 3. Build the model (any seed: wrap() copies rank 0's weights to every rank) and wrap it.
  torch::manual_seed(comm->rank());
  auto model = std::make_shared<Regressor>();
  model->to(device);
  auto ddp = dtorch::ddp::wrap(model, comm);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // 4. Train: each rank draws its own data; backward() averages gradients across ranks.
  auto gen = at::detail::createCPUGenerator(1000 + comm->rank());
  auto target_w = torch::linspace(-1, 1, 8);
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    auto x = torch::randn({32, 8}, gen).to(device);
    auto y = torch::sin(x.matmul(target_w.to(device))).unsqueeze(1);
    auto loss = torch::mse_loss(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();

    // 5. Report the loss averaged over ranks (a collective: every rank calls it).
    auto avg = loss.detach().clone();
    comm->allreduce(avg, dtorch::comm::ReduceOp::Avg);
    if (step == 0) first = avg.item<double>();
    last = avg.item<double>();
    if (comm->rank() == 0 && step % 100 == 0) {
      std::cout << "step " << step << " loss " << last << std::endl;
    }
  }
  if (comm->rank() == 0) {
    std::cout << "ranks " << comm->size() << " loss " << first << " -> " << last << std::endl;
  }
  return last < first / 4 ? 0 : 1;  // a tiny check that training worked
} catch (const std::exception& e) {
  std::cerr << "ddp_custom_model: " << e.what() << std::endl;
  return 1;
}
